//! The only place that encodes and versions resources.
//!
//! Each translated resource is encoded once into an `istio.mcp.v1alpha1.Resource` held as shared
//! [`Bytes`]; every stream to every sink sends those same bytes. A [`Snapshot`] is the complete,
//! name-sorted set served at one moment; its version is a hash of names and versions, so two
//! replicas over the same input agree and a re-list that changes nothing changes no version.
//! A snapshot made from the previous one with a few changes shares almost all of it (see
//! `snapshot`), so one change costs O(changed · log n) however many services are served.

mod encode;
mod entries;
pub mod json;
/// An entry with no body, for tests that only look at names and versions.
#[cfg(test)]
pub(crate) use entries::tests::mk_entry;
mod snapshot;
pub mod state_file;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use prost::Message;
use proto::istio::mcp::v1alpha1::{Metadata, Resource};
use xxhash_rust::xxh3::Xxh3;

use crate::translate::Translated;

pub use entries::Change;
pub use snapshot::{diff, Known, Snapshot, SnapshotNames};

/// One encoded resource version.
#[derive(Debug, PartialEq)]
pub struct Entry {
    /// `namespace/name`.
    pub name: Arc<str>,
    /// Content hash (16 hex digits).
    pub version: Arc<str>,
    /// Encoded `istio.mcp.v1alpha1.Resource`.
    pub resource: Bytes,
    /// What /debug/resources shows without decoding.
    pub summary: Summary,
}

/// A small description of an entry for people.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Summary {
    /// Hosts of the ServiceEntry.
    pub hosts: Vec<String>,
    /// Number of ports.
    pub ports: usize,
    /// Number of endpoints.
    pub endpoints: usize,
    /// `metadata.create_time` as Unix seconds.
    pub create_time: i64,
}

fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    let (seconds, nanos) = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, d.subsec_nanos() as i32),
        Err(e) => {
            let d = e.duration();
            // Before 1970: seconds go negative, nanos stay positive (protobuf's rule).
            let mut s = -(d.as_secs() as i64);
            let mut n = d.subsec_nanos() as i32;
            if n > 0 {
                s -= 1;
                n = 1_000_000_000 - n;
            }
            (s, n)
        }
    };
    prost_types::Timestamp { seconds, nanos }
}

/// Encodes a translated resource and computes its version: a hash over everything a sink sees
/// except the version itself (body, name, labels, annotations, creation time).
pub fn encode(t: &Translated) -> Entry {
    let body = encode::encode_body(t);
    let create_time = timestamp(t.create_time);
    let mut h = Xxh3::new();
    h.update(t.name.as_bytes());
    h.update(&[0]);
    h.update(&body);
    for map in [&t.labels, &t.annotations] {
        for (k, v) in map {
            h.update(k.as_bytes());
            h.update(&[0]);
            h.update(v.as_bytes());
            h.update(&[0]);
        }
        h.update(&[1]);
    }
    h.update(&create_time.seconds.to_le_bytes());
    h.update(&create_time.nanos.to_le_bytes());
    let version = format!("{:016x}", h.digest());
    let resource = Resource {
        metadata: Some(Metadata {
            name: t.name.clone(),
            create_time: Some(create_time),
            version: version.clone(),
            labels: t.labels.clone(),
            annotations: t.annotations.clone(),
        }),
        body: Some(prost_types::Any {
            type_url: proto::SERVICE_ENTRY_TYPE_URL.to_string(),
            value: body,
        }),
    };
    Entry {
        name: t.name.as_str().into(),
        version: version.into(),
        resource: Bytes::from(resource.encode_to_vec()),
        summary: Summary {
            hosts: t.spec.hosts.clone(),
            ports: t.spec.ports.len(),
            endpoints: t.spec.endpoints.len() + t.endpoints.len(),
            create_time: create_time.seconds,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::FIXED_CREATE_TIME;
    use proto::istio::networking::v1alpha3::ServiceEntry;

    fn mk_translated() -> Translated {
        Translated {
            name: "ns/a".into(),
            create_time: FIXED_CREATE_TIME,
            labels: [("k".to_string(), "v".to_string())].into(),
            annotations: Default::default(),
            spec: ServiceEntry {
                hosts: vec!["a.example".into()],
                ..Default::default()
            },
            endpoints: vec![],
            warnings: vec![],
        }
    }

    #[test]
    fn version_is_a_content_hash() {
        let a = encode(&mk_translated());
        assert_eq!(
            a,
            encode(&mk_translated()),
            "same input, same bytes and version"
        );
        let mut t = mk_translated();
        t.labels.insert("k".into(), "w".into());
        assert_ne!(encode(&t).version, a.version);
        let mut t = mk_translated();
        t.spec.hosts.push("b.example".into());
        assert_ne!(encode(&t).version, a.version);
        let mut t = mk_translated();
        t.create_time = UNIX_EPOCH + std::time::Duration::from_secs(5);
        assert_ne!(encode(&t).version, a.version);
    }

    #[test]
    fn encodes_a_real_resource_with_create_time() {
        let e = encode(&mk_translated());
        let r = Resource::decode(e.resource.as_ref()).expect("decodes");
        let md = r.metadata.expect("metadata");
        assert_eq!(md.name, "ns/a");
        assert_eq!(md.version, &*e.version);
        assert!(
            md.create_time.is_some(),
            "istiod 1.8-1.13 drop resources without it"
        );
        let body = r.body.expect("body");
        assert_eq!(body.type_url, proto::SERVICE_ENTRY_TYPE_URL);
        assert_eq!(
            ServiceEntry::decode(body.value.as_slice())
                .expect("se")
                .hosts,
            vec!["a.example"]
        );
    }

    #[test]
    fn timestamps_before_1970() {
        let t = UNIX_EPOCH - std::time::Duration::from_millis(1500);
        assert_eq!(
            timestamp(t),
            prost_types::Timestamp {
                seconds: -2,
                nanos: 500_000_000
            }
        );
    }
}
