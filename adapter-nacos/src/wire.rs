//! Nacos 2.x's gRPC protocol: one message type, `Payload`, whose metadata names the request or
//! response type and whose body is that object's JSON in a `google.protobuf.Any`. Two methods
//! are used: `/Request/request` (unary: server check, subscribe, health check) and
//! `/BiRequestStream/requestBiStream` (the connection's stream: the setup request goes up, the
//! server's pushes come down and their acknowledgements go up).
//!
//! The messages are declared here rather than generated: three small messages, with the field
//! numbers of Nacos' `nacos_grpc_service.proto`.

use std::collections::HashMap;

use prost_types::Any;
use serde_json::Value;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;

/// Request and response metadata.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Metadata {
    /// The body's type: the Java class's simple name (`SubscribeServiceRequest`).
    #[prost(string, tag = "3")]
    pub r#type: String,
    /// The client's address as it sees it (informational).
    #[prost(string, tag = "8")]
    pub client_ip: String,
    /// Request headers: `accessToken` among them.
    #[prost(map = "string, string", tag = "7")]
    pub headers: HashMap<String, String>,
}

/// The one message of the protocol.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Payload {
    /// Type and headers.
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<Metadata>,
    /// The JSON body (`Any.value`; the type URL is unused).
    #[prost(message, optional, tag = "3")]
    pub body: Option<Any>,
}

/// Why a gRPC exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The call failed at the gRPC level (connection, deadline).
    #[error("{call}: {status}")]
    Status {
        /// The request type.
        call: String,
        /// What tonic said.
        status: String,
    },
    /// The body is not the JSON it should be.
    #[error("{call}: the answer is not JSON ({message})")]
    Json {
        /// The request type.
        call: String,
        /// serde's message.
        message: String,
    },
}

impl Payload {
    /// A payload of type `kind` with `body` as its JSON and `headers` in its metadata.
    pub fn new(kind: &str, body: &Value, headers: &HashMap<String, String>) -> Self {
        Self {
            metadata: Some(Metadata {
                r#type: kind.to_string(),
                client_ip: String::new(),
                headers: headers.clone(),
            }),
            body: Some(Any {
                type_url: String::new(),
                value: body.to_string().into_bytes(),
            }),
        }
    }

    /// The type named in the metadata.
    pub fn kind(&self) -> &str {
        self.metadata.as_ref().map_or("", |m| m.r#type.as_str())
    }

    /// The body's bytes.
    pub fn json(&self) -> &[u8] {
        self.body.as_ref().map_or(&[], |b| b.value.as_slice())
    }

    /// The body as `T`; `call` names the exchange in the error.
    pub fn parse<T: serde::de::DeserializeOwned>(&self, call: &str) -> Result<T, WireError> {
        serde_json::from_slice(self.json()).map_err(|e| WireError::Json {
            call: call.to_string(),
            message: e.to_string(),
        })
    }
}

/// The largest message Nacos' own Java client takes by default
/// (`nacos.remote.client.grpc.maxinbound.message.size`, 10 MiB). tonic's own default, 4 MiB, is
/// less than one push of a few thousand Dubbo instances with their metadata.
pub const NACOS_CLIENT_MAX_MESSAGE: usize = 10 << 20;

/// The two methods over one channel (one HTTP/2 connection: Nacos ties the unary requests to
/// the stream by the connection they arrive on).
#[derive(Clone, Debug)]
pub struct Rpc {
    grpc: tonic::client::Grpc<Channel>,
}

impl Rpc {
    /// Over `channel`, reading messages of up to `max_message` bytes (a larger one fails its
    /// call, or ends the stream, with an error naming the size).
    pub fn new(channel: Channel, max_message: usize) -> Self {
        Self {
            grpc: tonic::client::Grpc::new(channel)
                .max_decoding_message_size(max_message)
                .max_encoding_message_size(max_message),
        }
    }

    /// `/Request/request`.
    pub async fn request(&mut self, payload: Payload) -> Result<Payload, WireError> {
        let call = payload.kind().to_string();
        self.ready(&call).await?;
        self.grpc
            .unary(
                tonic::Request::new(payload),
                PathAndQuery::from_static("/Request/request"),
                codec(),
            )
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| status(&call, s))
    }

    /// `/BiRequestStream/requestBiStream`: `up` is what the client sends; the answer streams
    /// what the server sends.
    pub async fn bi_stream(
        &mut self,
        up: impl futures::Stream<Item = Payload> + Send + 'static,
    ) -> Result<tonic::Streaming<Payload>, WireError> {
        let call = "requestBiStream";
        self.ready(call).await?;
        self.grpc
            .streaming(
                tonic::Request::new(up),
                PathAndQuery::from_static("/BiRequestStream/requestBiStream"),
                codec(),
            )
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| status(call, s))
    }

    async fn ready(&mut self, call: &str) -> Result<(), WireError> {
        self.grpc
            .ready()
            .await
            .map_err(|e| status(call, tonic::Status::unavailable(e.to_string())))
    }
}

fn codec() -> tonic_prost::ProstCodec<Payload, Payload> {
    tonic_prost::ProstCodec::default()
}

fn status(call: &str, s: tonic::Status) -> WireError {
    WireError::Status {
        call: call.to_string(),
        status: format!("{:?}: {}", s.code(), s.message()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn a_payload_round_trips_with_its_type_headers_and_json() {
        let headers = HashMap::from([("accessToken".to_string(), "t".to_string())]);
        let p = Payload::new(
            "SubscribeServiceRequest",
            &serde_json::json!({"serviceName": "orders"}),
            &headers,
        );
        let bytes = p.encode_to_vec();
        let back = Payload::decode(bytes.as_slice()).expect("decode");
        assert_eq!(back.kind(), "SubscribeServiceRequest");
        assert_eq!(
            back.metadata
                .as_ref()
                .and_then(|m| m.headers.get("accessToken")),
            Some(&"t".to_string())
        );
        let v: Value = back.parse("x").expect("json");
        assert_eq!(v["serviceName"], "orders");
        // Field numbers as Nacos' proto: metadata 2, body 3; type 3, headers 7, clientIp 8.
        assert_eq!(bytes[0], (2 << 3) | 2);
    }
}
