//! Responses written to the wire as gRPC frames around the shared resource bytes.
//!
//! A full-state response is the whole served set. Encoding it the usual way (one contiguous
//! buffer per message, which tonic keeps per stream at the size of the largest message) costs
//! every connected sink a copy of the snapshot. Here a response is an [`Encoded`]: its small
//! fields encoded up front, the resources as the cache's shared [`Bytes`], and the length known
//! without writing anything. [`Chunks`] then walks it: small pieces are copied into chunks of at
//! most [`CHUNK`] bytes, and a resource of [`SHARE`] bytes or more is handed to the transport as
//! the cache's own buffer. What a stream holds is one chunk, never the response.
//!
//! The bytes are exactly prost's encoding of the message with the same fields (tested against
//! `proto::responses`), in field-number order: head fields, the repeated resources, tail fields.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};

use mcp_core::cache::Entry;

/// Target size of a copied chunk. Large enough that a 100 MB response is a few thousand writes,
/// small enough that a stream that stopped reading holds little.
pub const CHUNK: usize = 64 << 10;

/// Resources at least this large are not copied: the chunk before them is closed and the
/// resource's shared bytes follow as their own chunk.
pub const SHARE: usize = 8 << 10;

/// How one resource is wrapped in the response's repeated field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wrap {
    /// `repeated istio.mcp.v1alpha1.Resource field`: the resource bytes themselves.
    Raw {
        /// Field number of the repeated field.
        field: u32,
    },
    /// `repeated google.protobuf.Any field` holding the resource (SotW xDS).
    Any {
        /// Field number of the repeated field.
        field: u32,
    },
    /// `repeated envoy.service.discovery.v3.Resource field`: version, Any, name (delta xDS).
    Delta {
        /// Field number of the repeated field.
        field: u32,
    },
}

fn string_len(tag: u32, s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        key_len(tag) + encoded_len_varint(s.len() as u64) + s.len()
    }
}

fn put_string(tag: u32, s: &str, buf: &mut BytesMut) {
    if !s.is_empty() {
        encode_key(tag, WireType::LengthDelimited, buf);
        encode_varint(s.len() as u64, buf);
        buf.put_slice(s.as_bytes());
    }
}

fn delimited_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

fn put_header(tag: u32, len: usize, buf: &mut BytesMut) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(len as u64, buf);
}

impl Wrap {
    /// Length of `Any { type_url, value: resource }`.
    fn any_len(resource: usize) -> usize {
        string_len(1, proto::MCP_RESOURCE_TYPE_URL)
            + if resource == 0 {
                0
            } else {
                delimited_len(2, resource)
            }
    }

    /// Length of the wrapped message (without the outer key and length).
    fn inner_len(self, e: &Entry) -> usize {
        let r = e.resource.len();
        match self {
            Wrap::Raw { .. } => r,
            Wrap::Any { .. } => Self::any_len(r),
            Wrap::Delta { .. } => {
                string_len(1, &e.version)
                    + delimited_len(2, Self::any_len(r))
                    + string_len(3, &e.name)
            }
        }
    }

    /// Bytes this resource adds to the response.
    fn encoded_len(self, e: &Entry) -> usize {
        let field = match self {
            Wrap::Raw { field } | Wrap::Any { field } | Wrap::Delta { field } => field,
        };
        delimited_len(field, self.inner_len(e))
    }

    /// Everything before the resource bytes.
    fn prefix(self, e: &Entry, buf: &mut BytesMut) {
        let r = e.resource.len();
        let any = |buf: &mut BytesMut| {
            put_string(1, proto::MCP_RESOURCE_TYPE_URL, buf);
            if r > 0 {
                put_header(2, r, buf);
            }
        };
        match self {
            Wrap::Raw { field } => put_header(field, r, buf),
            Wrap::Any { field } => {
                put_header(field, self.inner_len(e), buf);
                any(buf);
            }
            Wrap::Delta { field } => {
                put_header(field, self.inner_len(e), buf);
                put_string(1, &e.version, buf);
                put_header(2, Self::any_len(r), buf);
                any(buf);
            }
        }
    }

    /// Everything after the resource bytes.
    fn suffix(self, e: &Entry, buf: &mut BytesMut) {
        if let Wrap::Delta { .. } = self {
            put_string(3, &e.name, buf);
        }
    }
}

/// A response ready to be written.
#[derive(Debug)]
pub struct Encoded {
    /// Encoded fields numbered below the resources.
    head: Bytes,
    resources: Vec<Arc<Entry>>,
    wrap: Wrap,
    /// Encoded fields numbered above the resources.
    tail: Bytes,
    len: usize,
}

impl Encoded {
    /// A response from its parts: `head` and `tail` are the response message with only the
    /// fields numbered below (above) the resources set; they are encoded here. Pass messages,
    /// not encoded bytes: a `Vec<u8>` is a `Message` too (`BytesValue`) and would be wrapped.
    pub fn new(
        head: impl prost::Message,
        resources: Vec<Arc<Entry>>,
        wrap: Wrap,
        tail: impl prost::Message,
    ) -> Self {
        let (head, tail) = (head.encode_to_vec(), tail.encode_to_vec());
        let len =
            head.len() + tail.len() + resources.iter().map(|e| wrap.encoded_len(e)).sum::<usize>();
        Self {
            head: head.into(),
            resources,
            wrap,
            tail: tail.into(),
            len,
        }
    }

    /// Length of the message (without the 5-byte gRPC frame prefix).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the message encodes to nothing (all fields at their defaults).
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The frame's pieces, in order. Fails only for a message gRPC cannot frame (4 GiB or more).
    pub fn chunks(self) -> Result<Chunks, TooLarge> {
        let len = u32::try_from(self.len).map_err(|_| TooLarge(self.len))?;
        Ok(Chunks {
            frame_len: len,
            left: self.len + 5,
            response: self,
            started: false,
            next: 0,
            pending: None,
            suffix_of: None,
            done: false,
        })
    }

    /// The whole frame in one buffer (tests and small responses).
    #[cfg(test)]
    pub fn into_vec(self) -> Vec<u8> {
        let mut out = Vec::new();
        for c in self.chunks().expect("frame") {
            out.extend_from_slice(&c);
        }
        out
    }
}

/// A message gRPC cannot frame: its length prefix is 32 bits.
#[derive(Debug, thiserror::Error)]
#[error("a response of {0} bytes exceeds gRPC's 4 GiB message limit")]
pub struct TooLarge(pub usize);

/// Walks one [`Encoded`] response as gRPC frame pieces (see the module docs).
#[derive(Debug)]
pub struct Chunks {
    response: Encoded,
    frame_len: u32,
    /// Bytes of the frame not handed out yet: a copied piece is allocated at most this large
    /// (an empty answer is a few hundred bytes, not a whole [`CHUNK`]).
    left: usize,
    started: bool,
    /// Next resource to write.
    next: usize,
    /// Shared resource bytes to hand out next.
    pending: Option<Bytes>,
    /// The resource whose suffix is due (after its shared bytes went out).
    suffix_of: Option<usize>,
    done: bool,
}

impl Iterator for Chunks {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        let piece = self.piece()?;
        self.left = self.left.saturating_sub(piece.len());
        Some(piece)
    }
}

impl Chunks {
    fn piece(&mut self) -> Option<Bytes> {
        if let Some(p) = self.pending.take() {
            return Some(p);
        }
        if self.done {
            return None;
        }
        let r = &self.response;
        let mut buf = BytesMut::with_capacity(self.left.min(CHUNK + SHARE));
        if !self.started {
            self.started = true;
            buf.put_u8(0); // not compressed
            buf.put_u32(self.frame_len);
            buf.put_slice(&r.head);
        }
        if let Some(i) = self.suffix_of.take() {
            r.wrap.suffix(&r.resources[i], &mut buf);
        }
        while self.next < r.resources.len() {
            if buf.len() >= CHUNK {
                return Some(buf.freeze());
            }
            let e = &r.resources[self.next];
            r.wrap.prefix(e, &mut buf);
            self.next += 1;
            if e.resource.len() >= SHARE {
                self.pending = Some(e.resource.clone());
                self.suffix_of = Some(self.next - 1);
                return Some(buf.freeze());
            }
            buf.put_slice(&e.resource);
            r.wrap.suffix(e, &mut buf);
        }
        self.done = true;
        if r.tail.len() >= SHARE && !buf.is_empty() {
            self.pending = Some(r.tail.clone());
        } else {
            buf.put_slice(&r.tail);
        }
        Some(buf.freeze())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcp_core::cache::Summary;
    use prost::Message;
    use proto::responses::{DeltaDiscoveryResponse, DeltaResource, DiscoveryResponse, SharedAny};

    fn entry(name: &str, size: usize) -> Arc<Entry> {
        Arc::new(Entry {
            name: name.into(),
            version: format!("{:016x}", size).into(),
            resource: Bytes::from((0..size).map(|i| (i % 251) as u8).collect::<Vec<u8>>()),
            summary: Summary {
                hosts: vec![],
                ports: 0,
                endpoints: 0,
                create_time: 0,
            },
        })
    }

    fn framed(msg: &impl Message) -> Vec<u8> {
        let body = msg.encode_to_vec();
        let mut out = vec![0];
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Small, shared-size and empty resources, enough of them to span several chunks.
    fn entries() -> Vec<Arc<Entry>> {
        let mut v = Vec::new();
        for i in 0..200 {
            let size = match i % 7 {
                0 => SHARE + 13,
                1 => 0,
                _ => 300 + i * 5,
            };
            v.push(entry(&format!("ns/svc-{i:03}"), size));
        }
        v
    }

    #[test]
    fn sotw_frames_are_prosts_bytes() {
        let es = entries();
        let want = DiscoveryResponse {
            version_info: "v1".into(),
            resources: es
                .iter()
                .map(|e| SharedAny {
                    type_url: proto::MCP_RESOURCE_TYPE_URL,
                    value: e.resource.clone(),
                })
                .collect(),
            type_url: "networking.istio.io/v1/ServiceEntry".into(),
            nonce: "7".into(),
        };
        let head = DiscoveryResponse {
            version_info: "v1".into(),
            ..Default::default()
        };
        let tail = DiscoveryResponse {
            type_url: want.type_url.clone(),
            nonce: want.nonce.clone(),
            ..Default::default()
        };
        let enc = Encoded::new(head, es, Wrap::Any { field: 2 }, tail);
        assert_eq!(enc.len(), want.encoded_len());
        assert_eq!(enc.into_vec(), framed(&want));
    }

    #[test]
    fn delta_frames_are_prosts_bytes() {
        let es = entries();
        let want = DeltaDiscoveryResponse {
            system_version_info: "v2".into(),
            resources: es
                .iter()
                .map(|e| DeltaResource {
                    version: e.version.to_string(),
                    resource: Some(SharedAny {
                        type_url: proto::MCP_RESOURCE_TYPE_URL,
                        value: e.resource.clone(),
                    }),
                    name: e.name.to_string(),
                })
                .collect(),
            type_url: "networking.istio.io/v1/ServiceEntry".into(),
            nonce: "3".into(),
            removed_resources: (0..3000).map(|i| format!("ns/gone-{i}")).collect(),
        };
        let head = DeltaDiscoveryResponse {
            system_version_info: want.system_version_info.clone(),
            ..Default::default()
        };
        let tail = DeltaDiscoveryResponse {
            type_url: want.type_url.clone(),
            nonce: want.nonce.clone(),
            removed_resources: want.removed_resources.clone(),
            ..Default::default()
        };
        assert!(
            tail.encoded_len() > SHARE,
            "the tail is handed out as its own piece"
        );
        let enc = Encoded::new(head, es, Wrap::Delta { field: 2 }, tail);
        assert_eq!(enc.into_vec(), framed(&want));
    }

    #[test]
    fn raw_frames_and_empty_messages() {
        let es = entries();
        let want = proto::responses::MeshConfigResponse {
            version_info: "v".into(),
            resources: es.iter().map(|e| e.resource.clone()).collect(),
            type_url: "t".into(),
            nonce: "n".into(),
        };
        let enc = Encoded::new(
            proto::responses::MeshConfigResponse {
                version_info: "v".into(),
                ..Default::default()
            },
            es,
            Wrap::Raw { field: 2 },
            proto::responses::MeshConfigResponse {
                type_url: "t".into(),
                nonce: "n".into(),
                ..Default::default()
            },
        );
        assert_eq!(enc.into_vec(), framed(&want));
        let empty = Encoded::new((), vec![], Wrap::Raw { field: 2 }, ());
        assert!(empty.is_empty());
        assert_eq!(empty.into_vec(), vec![0, 0, 0, 0, 0]);
    }

    #[test]
    fn pieces_are_bounded_and_large_resources_are_not_copied() {
        let es = entries();
        let shared: Vec<Bytes> = es
            .iter()
            .filter(|e| e.resource.len() >= SHARE)
            .map(|e| e.resource.clone())
            .collect();
        let enc = Encoded::new((), es, Wrap::Any { field: 2 }, ());
        let total = enc.len() + 5;
        let pieces: Vec<Bytes> = enc.chunks().expect("frame").collect();
        assert_eq!(pieces.iter().map(Bytes::len).sum::<usize>(), total);
        for p in &pieces {
            assert!(p.len() < CHUNK + 2 * SHARE, "piece of {} bytes", p.len());
        }
        // The large resources went out as the cache's own buffers, not copies.
        for s in &shared {
            assert!(
                pieces
                    .iter()
                    .any(|p| p.as_ptr() == s.as_ptr() && p.len() == s.len()),
                "a shared resource was copied"
            );
        }
        assert!(pieces.len() > 2, "several chunks: {}", pieces.len());

        // What is left to hand out is tracked exactly: it sizes the copied pieces.
        let small = Encoded::new((), vec![entry("ns/a", 10)], Wrap::Any { field: 2 }, ());
        let total = small.len() + 5;
        let mut chunks = small.chunks().expect("frame");
        assert_eq!(chunks.left, total);
        let piece = chunks.next().expect("one piece");
        assert_eq!(piece.len(), total);
        assert_eq!(chunks.left, 0);
        assert!(chunks.next().is_none());
    }
}
