//! The ServiceEntry body, encoded straight from a [`Translated`] resource.
//!
//! Endpoints stay in model form up to here: their labels are shared [`LabelSet`]s and their
//! network, locality and service account shared strings, so building a protobuf
//! `WorkloadEntry` would copy every label of every endpoint into a fresh map only to encode and
//! drop it. Instead each endpoint is written from the model with prost's wire helpers. The bytes
//! are exactly what prost writes for the equivalent `ServiceEntry` (fields in tag order, proto3
//! defaults omitted, map entries in key order), so versions do not depend on which path built
//! them; `tests::same_bytes_as_prost` holds that.
//!
//! [`LabelSet`]: crate::model::LabelSet

use bytes::BufMut;
use prost::encoding::{self, encode_key, encode_varint, encoded_len_varint, key_len, WireType};
use prost::Message;
use proto::istio::networking::v1alpha3::ServiceEntry;

use crate::model::Endpoint;
use crate::translate::Translated;

/// The encoded `istio.networking.v1alpha3.ServiceEntry` of `t`, with its endpoints.
pub(super) fn encode_body(t: &Translated) -> Vec<u8> {
    let body = Body {
        spec: &t.spec,
        endpoints: &t.endpoints,
    };
    let mut buf = Vec::with_capacity(body.encoded_len());
    body.encode_raw(&mut buf);
    buf
}

/// `ServiceEntry` fields 1-5 and 7-9 from the spec, field 6 (`endpoints`) from the model.
#[derive(Debug)]
struct Body<'a> {
    spec: &'a ServiceEntry,
    endpoints: &'a [Endpoint],
}

impl Body<'_> {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        let s = self.spec;
        encoding::string::encode_repeated(1, &s.hosts, buf);
        encoding::string::encode_repeated(2, &s.addresses, buf);
        encoding::message::encode_repeated(3, &s.ports, buf);
        if s.location != 0 {
            encoding::int32::encode(4, &s.location, buf);
        }
        if s.resolution != 0 {
            encoding::int32::encode(5, &s.resolution, buf);
        }
        // Empty after `translate`; written first if a caller filled it.
        encoding::message::encode_repeated(6, &s.endpoints, buf);
        for ep in self.endpoints {
            let ep = WorkloadEntry(ep);
            encode_key(6, WireType::LengthDelimited, buf);
            encode_varint(ep.len() as u64, buf);
            ep.encode_raw(buf);
        }
        encoding::string::encode_repeated(7, &s.export_to, buf);
        encoding::string::encode_repeated(8, &s.subject_alt_names, buf);
        if let Some(sel) = &s.workload_selector {
            encoding::message::encode(9, sel, buf);
        }
    }

    fn encoded_len(&self) -> usize {
        let s = self.spec;
        let endpoints: usize = self
            .endpoints
            .iter()
            .map(|ep| {
                let len = WorkloadEntry(ep).len();
                key_len(6) + encoded_len_varint(len as u64) + len
            })
            .sum();
        s.encoded_len() + endpoints
    }
}

/// `istio.networking.v1alpha3.WorkloadEntry` written from a model endpoint.
struct WorkloadEntry<'a>(&'a Endpoint);

impl WorkloadEntry<'_> {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        let ep = self.0;
        put_str(1, &ep.address, buf);
        for (name, number) in &ep.ports {
            // A map entry is a message {key = 1, value = 2}; prost omits default key and value.
            let len = str_len(1, name) + u32_len(2, *number);
            encode_key(2, WireType::LengthDelimited, buf);
            encode_varint(len as u64, buf);
            put_str(1, name, buf);
            put_u32(2, *number, buf);
        }
        for (k, v) in &ep.labels {
            let len = str_len(1, k) + str_len(2, v);
            encode_key(3, WireType::LengthDelimited, buf);
            encode_varint(len as u64, buf);
            put_str(1, k, buf);
            put_str(2, v, buf);
        }
        put_str(4, ep.network.as_deref().unwrap_or_default(), buf);
        put_str(5, ep.locality.as_deref().unwrap_or_default(), buf);
        put_u32(6, ep.weight.unwrap_or(0), buf);
        put_str(7, ep.service_account.as_deref().unwrap_or_default(), buf);
    }

    fn len(&self) -> usize {
        let ep = self.0;
        let entry = |len: usize| key_len(2) + encoded_len_varint(len as u64) + len;
        let ports: usize = ep
            .ports
            .iter()
            .map(|(name, number)| entry(str_len(1, name) + u32_len(2, *number)))
            .sum();
        let labels: usize = ep
            .labels
            .iter()
            .map(|(k, v)| entry(str_len(1, k) + str_len(2, v)))
            .sum();
        str_len(1, &ep.address)
            + ports
            + labels
            + str_len(4, ep.network.as_deref().unwrap_or_default())
            + str_len(5, ep.locality.as_deref().unwrap_or_default())
            + u32_len(6, ep.weight.unwrap_or(0))
            + str_len(7, ep.service_account.as_deref().unwrap_or_default())
    }
}

/// A proto3 `string` field; the empty string is the default and is not written.
fn put_str(tag: u32, s: &str, buf: &mut impl BufMut) {
    if !s.is_empty() {
        encode_key(tag, WireType::LengthDelimited, buf);
        encode_varint(s.len() as u64, buf);
        buf.put_slice(s.as_bytes());
    }
}

fn str_len(tag: u32, s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        key_len(tag) + encoded_len_varint(s.len() as u64) + s.len()
    }
}

/// A proto3 `uint32` field; 0 is the default and is not written.
fn put_u32(tag: u32, n: u32, buf: &mut impl BufMut) {
    if n != 0 {
        encoding::uint32::encode(tag, &n, buf);
    }
}

fn u32_len(tag: u32, n: u32) -> usize {
    if n == 0 {
        0
    } else {
        encoding::uint32::encoded_len(tag, &n)
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use proto::istio::networking::v1alpha3::{ServicePort, WorkloadSelector};

    use super::*;
    use crate::model::{LabelSet, SharedStr};

    fn translated(endpoints: Vec<Endpoint>) -> Translated {
        Translated {
            name: "ns/a".into(),
            create_time: UNIX_EPOCH,
            labels: Default::default(),
            annotations: Default::default(),
            spec: ServiceEntry {
                hosts: vec!["a.example".into(), "b.example".into()],
                addresses: vec!["10.0.0.0/24".into()],
                ports: vec![ServicePort {
                    number: 8080,
                    protocol: "HTTP".into(),
                    name: "http".into(),
                    target_port: 0,
                }],
                location: 1,
                resolution: 1,
                endpoints: vec![],
                export_to: vec!["*".into()],
                subject_alt_names: vec!["spiffe://a".into()],
                workload_selector: None,
            },
            endpoints,
            warnings: vec![],
        }
    }

    /// Every field set, every field at its default, and the corners in between (empty label
    /// values and keys, an empty shared string, weight 0, port number 0, long values whose
    /// length takes two varint bytes).
    #[test]
    fn same_bytes_as_prost() {
        let long = "x".repeat(300);
        let full = Endpoint {
            address: "10.0.0.1".into(),
            ports: [("http".to_string(), 9090), ("zero".to_string(), 0)]
                .into_iter()
                .collect(),
            labels: [
                ("app", "web"),
                ("empty", ""),
                ("", "no-key"),
                ("long", &long),
            ]
            .into_iter()
            .collect(),
            network: Some(SharedStr::from("net-1")),
            locality: Some(SharedStr::from(long.as_str())),
            weight: Some(7),
            service_account: Some(SharedStr::from("sa")),
        };
        let defaults = Endpoint::default();
        let corners = Endpoint {
            address: "10.0.0.2".into(),
            labels: LabelSet::from_iter([("v", "1")]),
            network: Some(SharedStr::from("")),
            weight: Some(0),
            ..Endpoint::default()
        };
        for endpoints in [vec![], vec![full, defaults, corners]] {
            let mut t = translated(endpoints);
            for selector in [None, Some(WorkloadSelector::default())] {
                t.spec.workload_selector = selector;
                let body = encode_body(&t);
                assert_eq!(body, t.service_entry().encode_to_vec());
                assert_eq!(
                    ServiceEntry::decode(body.as_slice()).expect("decodes"),
                    t.service_entry()
                );
            }
            // Defaults everywhere in the spec too.
            t.spec = ServiceEntry::default();
            assert_eq!(encode_body(&t), t.service_entry().encode_to_vec());
        }
    }
}
