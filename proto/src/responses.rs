//! Response messages as the servers send them.
//!
//! Each is byte-identical on the wire to the message of the same name in the real schema, but a
//! resource travels as shared, pre-encoded [`Bytes`]: a `repeated Resource` field is declared as
//! `repeated bytes` (both are length-delimited, so the encoding is the same), and an xDS
//! `google.protobuf.Any` is [`SharedAny`]. Encoding a response copies each resource once into the
//! transport buffer and never re-encodes it.

use bytes::{Buf, BufMut, Bytes};
use prost::encoding::{self, DecodeContext, WireType};
use prost::DecodeError;

/// `google.protobuf.Any` whose value is a shared, pre-encoded message.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SharedAny {
    /// `Any.type_url` (field 1).
    pub type_url: &'static str,
    /// `Any.value` (field 2).
    pub value: Bytes,
}

impl prost::Message for SharedAny {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if !self.type_url.is_empty() {
            encoding::encode_key(1, WireType::LengthDelimited, buf);
            encoding::encode_varint(self.type_url.len() as u64, buf);
            buf.put_slice(self.type_url.as_bytes());
        }
        if !self.value.is_empty() {
            encoding::bytes::encode(2, &self.value, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        // Servers never decode responses; skipping keeps the type total without owning a String.
        encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        let url = if self.type_url.is_empty() {
            0
        } else {
            encoding::key_len(1)
                + encoding::encoded_len_varint(self.type_url.len() as u64)
                + self.type_url.len()
        };
        let value = if self.value.is_empty() {
            0
        } else {
            encoding::bytes::encoded_len(2, &self.value)
        };
        url + value
    }

    fn clear(&mut self) {
        self.type_url = "";
        self.value = Bytes::new();
    }
}

/// `envoy.service.discovery.v3.DiscoveryResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DiscoveryResponse {
    #[prost(string, tag = "1")]
    pub version_info: String,
    #[prost(message, repeated, tag = "2")]
    pub resources: Vec<SharedAny>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, tag = "5")]
    pub nonce: String,
}

/// `envoy.service.discovery.v3.Resource` (the delta envelope).
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeltaResource {
    #[prost(string, tag = "1")]
    pub version: String,
    #[prost(message, optional, tag = "2")]
    pub resource: Option<SharedAny>,
    #[prost(string, tag = "3")]
    pub name: String,
}

/// `envoy.service.discovery.v3.DeltaDiscoveryResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeltaDiscoveryResponse {
    #[prost(string, tag = "1")]
    pub system_version_info: String,
    #[prost(message, repeated, tag = "2")]
    pub resources: Vec<DeltaResource>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, tag = "5")]
    pub nonce: String,
    #[prost(string, repeated, tag = "6")]
    pub removed_resources: Vec<String>,
}

/// `istio.mcp.v1alpha1.Resources`; `resources` holds encoded `istio.mcp.v1alpha1.Resource`s.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Resources {
    #[prost(string, tag = "1")]
    pub system_version_info: String,
    #[prost(string, tag = "2")]
    pub collection: String,
    #[prost(bytes = "bytes", repeated, tag = "3")]
    pub resources: Vec<Bytes>,
    #[prost(string, repeated, tag = "4")]
    pub removed_resources: Vec<String>,
    #[prost(string, tag = "5")]
    pub nonce: String,
    #[prost(bool, tag = "6")]
    pub incremental: bool,
}

/// `istio.mcp.v1alpha1.MeshConfigResponse`; `resources` holds encoded `Resource`s.
#[derive(Clone, PartialEq, prost::Message)]
pub struct MeshConfigResponse {
    #[prost(string, tag = "1")]
    pub version_info: String,
    #[prost(bytes = "bytes", repeated, tag = "2")]
    pub resources: Vec<Bytes>,
    #[prost(string, tag = "3")]
    pub type_url: String,
    #[prost(string, tag = "4")]
    pub nonce: String,
}

/// `istio.mcp.v1alpha1.IncrementalMeshConfigResponse`; `resources` holds encoded `Resource`s.
#[derive(Clone, PartialEq, prost::Message)]
pub struct IncrementalMeshConfigResponse {
    #[prost(string, tag = "1")]
    pub system_version_info: String,
    #[prost(bytes = "bytes", repeated, tag = "2")]
    pub resources: Vec<Bytes>,
    #[prost(string, repeated, tag = "3")]
    pub removed_resources: Vec<String>,
    #[prost(string, tag = "4")]
    pub nonce: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// The wire views must decode as the real messages.
    #[test]
    fn wire_views_decode_as_real_messages() {
        let body = Bytes::from_static(b"\x0a\x03abc");
        let resp = DiscoveryResponse {
            version_info: "v".into(),
            resources: vec![SharedAny {
                type_url: crate::MCP_RESOURCE_TYPE_URL,
                value: body.clone(),
            }],
            type_url: "t".into(),
            nonce: "n".into(),
        };
        let real = envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse::decode(
            resp.encode_to_vec().as_slice(),
        )
        .expect("decodes");
        assert_eq!(real.resources.len(), 1);
        assert_eq!(real.resources[0].type_url, crate::MCP_RESOURCE_TYPE_URL);
        assert_eq!(real.resources[0].value, body.to_vec());
        assert_eq!(real.nonce, "n");

        let res = crate::istio::mcp::v1alpha1::Resource {
            metadata: Some(crate::istio::mcp::v1alpha1::Metadata {
                name: "ns/a".into(),
                ..Default::default()
            }),
            body: None,
        };
        let legacy = Resources {
            collection: "c".into(),
            resources: vec![Bytes::from(res.encode_to_vec())],
            nonce: "1".into(),
            ..Default::default()
        };
        let real =
            crate::istio::mcp::v1alpha1::Resources::decode(legacy.encode_to_vec().as_slice())
                .expect("decodes");
        assert_eq!(real.resources, vec![res]);
        assert_eq!(real.collection, "c");
    }
}
