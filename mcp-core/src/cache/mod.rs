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
mod snapshot;
pub mod state_file;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use prost::Message;
use proto::istio::mcp::v1alpha1::{Metadata, Resource};
use xxhash_rust::xxh3::Xxh3;

use crate::model::Labels;
use crate::translate::Translated;
use proto::istio::networking::v1alpha3::ServiceEntry;

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
    let summary = Summary {
        hosts: t.spec.hosts.clone(),
        ports: t.spec.ports.len(),
        endpoints: t.spec.endpoints.len() + t.endpoints.len(),
        create_time: 0,
    };
    finish(
        t.name.clone(),
        encode::encode_body(t),
        t.labels.clone(),
        t.annotations.clone(),
        timestamp(t.create_time),
        summary,
    )
}

/// Why an entry could not be read back (never expected: this module wrote it).
#[derive(Debug, thiserror::Error)]
pub enum ReencodeError {
    /// The resource or its ServiceEntry body did not decode.
    #[error("entry {name}: {source}")]
    Decode {
        /// The entry's name.
        name: String,
        /// What prost reported.
        source: prost::DecodeError,
    },
}

impl Entry {
    /// The same resource with its ServiceEntry changed by `change`, versioned as [`encode`]
    /// versions it: what translating the changed service would give (prost writes a decoded
    /// ServiceEntry back to the same bytes `encode` writes; `tests::reencoded_equals_encoded`).
    /// For the rare change that needs no registry content, a moved virtual IP, so that the index
    /// does not keep every service a second time to translate it again.
    pub fn with_spec(
        &self,
        change: impl FnOnce(&mut ServiceEntry),
    ) -> Result<Entry, ReencodeError> {
        let failed = |source| ReencodeError::Decode {
            name: self.name.to_string(),
            source,
        };
        let r = Resource::decode(self.resource.as_ref()).map_err(failed)?;
        let md = r.metadata.unwrap_or_default();
        let body = r.body.map(|b| b.value).unwrap_or_default();
        let mut spec = ServiceEntry::decode(body.as_slice()).map_err(failed)?;
        change(&mut spec);
        let summary = Summary {
            hosts: spec.hosts.clone(),
            ports: spec.ports.len(),
            endpoints: spec.endpoints.len(),
            create_time: 0,
        };
        Ok(finish(
            md.name,
            spec.encode_to_vec(),
            md.labels,
            md.annotations,
            md.create_time.unwrap_or_default(),
            summary,
        ))
    }
}

/// The versioned, encoded resource.
fn finish(
    name: String,
    body: Vec<u8>,
    labels: Labels,
    annotations: Labels,
    create_time: prost_types::Timestamp,
    mut summary: Summary,
) -> Entry {
    let mut h = Xxh3::new();
    h.update(name.as_bytes());
    h.update(&[0]);
    h.update(&body);
    for map in [&labels, &annotations] {
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
    summary.create_time = create_time.seconds;
    let entry_name: Arc<str> = name.as_str().into();
    let resource = Resource {
        metadata: Some(Metadata {
            name,
            create_time: Some(create_time),
            version: version.clone(),
            labels,
            annotations,
        }),
        body: Some(prost_types::Any {
            type_url: proto::SERVICE_ENTRY_TYPE_URL.to_string(),
            value: body,
        }),
    };
    Entry {
        name: entry_name,
        version: version.into(),
        resource: Bytes::from(resource.encode_to_vec()),
        summary,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::FIXED_CREATE_TIME;

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

    /// A re-encoded entry is byte for byte the entry of the changed translation, endpoints,
    /// labels and all.
    #[test]
    fn reencoded_equals_encoded() {
        let mut t = mk_translated();
        t.spec.addresses = vec!["242.0.0.1".into()];
        t.endpoints = vec![crate::model::Endpoint {
            address: "10.0.0.1".into(),
            ports: [("tcp".to_string(), 9000)].into(),
            labels: crate::model::Labels::from([("app".to_string(), "a".to_string())]).into(),
            network: Some("n1".into()),
            locality: Some("r/z".into()),
            weight: Some(3),
            service_account: Some("sa".into()),
        }];
        t.annotations.insert("a".into(), "b".into());
        let before = encode(&t);
        t.spec.addresses = vec!["242.0.0.2".into()];
        let want = encode(&t);
        let got = before
            .with_spec(|s| s.addresses = vec!["242.0.0.2".into()])
            .expect("re-encodes");
        assert_eq!(got, want);
        assert_ne!(got.version, before.version);
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
