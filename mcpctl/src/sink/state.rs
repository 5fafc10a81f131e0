//! The state a sink keeps: decoding received resources, applying responses to the state, and
//! the [`Update`] each applied response yields.
//!
//! Everything here is pure (no I/O), so how each protocol's response changes the state can be
//! tested without a server. [`super::Sink`] only moves messages between the wire (the sink's
//! transport) and these functions.

use std::collections::BTreeMap;
use std::time::SystemTime;

use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryResponse, DiscoveryResponse};
use envoy_types::pb::google::protobuf::Any as EnvoyAny;
use prost::Message;
use proto::istio::mcp::v1alpha1::{Resource, Resources};
use proto::istio::networking::v1alpha3::ServiceEntry;

/// One ServiceEntry as the sink holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct Received {
    /// `namespace/name`, the MCP resource name and the key of the state.
    pub name: String,
    /// The part of `name` before the first `/` (empty for a name without `/`).
    pub namespace: String,
    /// The part of `name` after the first `/`.
    pub short_name: String,
    /// `Metadata.version` (becomes `resourceVersion`).
    pub version: String,
    /// `Metadata.create_time`.
    pub create_time: Option<SystemTime>,
    /// `Metadata.labels`, sorted so output is stable.
    pub labels: BTreeMap<String, String>,
    /// `Metadata.annotations`, sorted so output is stable.
    pub annotations: BTreeMap<String, String>,
    /// The decoded body.
    pub spec: ServiceEntry,
}

/// One applied response.
#[derive(Clone, Debug, PartialEq)]
pub struct Update {
    /// When the response was received.
    pub at: SystemTime,
    /// `version_info` (xds) or `system_version_info` (delta, mcp).
    pub version_info: String,
    /// The response nonce (which was ACKed).
    pub nonce: String,
    /// The full state after applying the response, keyed by `namespace/name`.
    pub state: BTreeMap<String, Received>,
    /// See [`Applied::upserted`].
    pub upserted: Vec<String>,
    /// See [`Applied::removed`].
    pub removed: Vec<String>,
    /// Whether the response was incremental (always for delta, never for xds).
    pub incremental: bool,
}

/// A resource that could not be decoded. Each variant names the resource, so a bad resource in a
/// large response can be found; when the MCP `Metadata` itself is unreadable the name is the
/// envelope's (delta) or the position in the response (`#3`).
#[derive(thiserror::Error, Debug)]
pub enum DecodeError {
    /// The envelope `Any` does not hold an `istio.mcp.v1alpha1.Resource`.
    #[error("resource {resource}: envelope type_url is {got:?}, expected {expected:?}")]
    EnvelopeTypeUrl {
        /// Name or position of the resource.
        resource: String,
        /// What arrived.
        got: String,
        /// [`proto::MCP_RESOURCE_TYPE_URL`].
        expected: &'static str,
    },
    /// A delta envelope without its `resource` field (only allowed for heartbeats, which MCP
    /// servers don't send).
    #[error("resource {resource}: delta envelope carries no resource")]
    EmptyEnvelope {
        /// The envelope's name.
        resource: String,
    },
    /// The bytes are not a valid `istio.mcp.v1alpha1.Resource`.
    #[error("resource {resource}: cannot decode istio.mcp.v1alpha1.Resource: {source}")]
    Resource {
        /// Name or position of the resource.
        resource: String,
        /// Protobuf error.
        source: prost::DecodeError,
    },
    /// `Resource.metadata` is missing or has an empty name.
    #[error("resource {resource}: missing metadata name")]
    MissingName {
        /// Position of the resource.
        resource: String,
    },
    /// `Resource.body` is missing.
    #[error("resource {resource}: missing body")]
    MissingBody {
        /// `namespace/name`.
        resource: String,
    },
    /// The body is not a ServiceEntry.
    #[error("resource {resource}: body type_url is {got:?}, expected {expected:?}")]
    BodyTypeUrl {
        /// `namespace/name`.
        resource: String,
        /// What arrived.
        got: String,
        /// [`proto::SERVICE_ENTRY_TYPE_URL`].
        expected: &'static str,
    },
    /// The body bytes are not a valid ServiceEntry.
    #[error("resource {resource}: cannot decode ServiceEntry body: {source}")]
    Body {
        /// `namespace/name`.
        resource: String,
        /// Protobuf error.
        source: prost::DecodeError,
    },
    /// `Metadata.create_time` is out of range.
    #[error("resource {resource}: invalid create_time: {source}")]
    CreateTime {
        /// `namespace/name`.
        resource: String,
        /// Range error.
        source: prost_types::TimestampError,
    },
}

/// How one response changes the state.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// State of the world: the resources are the whole new state; anything absent is deleted.
    Replace(Vec<Received>),
    /// Incremental: upsert these, then delete these names.
    Patch {
        /// Added or changed resources.
        upserts: Vec<Received>,
        /// Names (`namespace/name`) to delete.
        removals: Vec<String>,
    },
}

/// What [`apply`] did, for [`Update`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// For [`Change::Replace`] every name in the response; for [`Change::Patch`] the upserts,
    /// in response order.
    pub upserted: Vec<String>,
    /// For [`Change::Replace`] the names that were held before and are now absent (sorted); for
    /// [`Change::Patch`] the removals as the server sent them, whether held or not, so tests can
    /// see exactly what the server said.
    pub removed: Vec<String>,
}

/// Applies `change` to `state`.
pub fn apply(state: &mut BTreeMap<String, Received>, change: Change) -> Applied {
    match change {
        Change::Replace(resources) => {
            let upserted: Vec<String> = resources.iter().map(|r| r.name.clone()).collect();
            let new: BTreeMap<String, Received> =
                resources.into_iter().map(|r| (r.name.clone(), r)).collect();
            let removed = state
                .keys()
                .filter(|k| !new.contains_key(*k))
                .cloned()
                .collect();
            *state = new;
            Applied { upserted, removed }
        }
        Change::Patch { upserts, removals } => {
            let upserted = upserts.iter().map(|r| r.name.clone()).collect();
            for r in upserts {
                state.insert(r.name.clone(), r);
            }
            for name in &removals {
                state.remove(name);
            }
            Applied {
                upserted,
                removed: removals,
            }
        }
    }
}

/// Decodes an MCP `Resource`. `hint` names it in errors until its metadata name is known.
pub fn decode_resource(res: Resource, hint: &str) -> Result<Received, DecodeError> {
    let metadata = res.metadata.unwrap_or_default();
    if metadata.name.is_empty() {
        return Err(DecodeError::MissingName {
            resource: hint.to_string(),
        });
    }
    let name = metadata.name;
    let body = res.body.ok_or_else(|| DecodeError::MissingBody {
        resource: name.clone(),
    })?;
    // Accept any type URL prefix, as `Any` resolution does; only the message name matters.
    if body.type_url != proto::SERVICE_ENTRY_TYPE_URL
        && !body
            .type_url
            .ends_with("/istio.networking.v1alpha3.ServiceEntry")
    {
        return Err(DecodeError::BodyTypeUrl {
            resource: name,
            got: body.type_url,
            expected: proto::SERVICE_ENTRY_TYPE_URL,
        });
    }
    let spec = ServiceEntry::decode(body.value.as_slice()).map_err(|source| DecodeError::Body {
        resource: name.clone(),
        source,
    })?;
    let create_time = metadata
        .create_time
        .map(SystemTime::try_from)
        .transpose()
        .map_err(|source| DecodeError::CreateTime {
            resource: name.clone(),
            source,
        })?;
    let (namespace, short_name) = match name.split_once('/') {
        Some((ns, n)) => (ns.to_string(), n.to_string()),
        None => (String::new(), name.clone()),
    };
    Ok(Received {
        namespace,
        short_name,
        version: metadata.version,
        create_time,
        labels: metadata.labels.into_iter().collect(),
        annotations: metadata.annotations.into_iter().collect(),
        spec,
        name,
    })
}

/// Decodes an MCP `Resource` carried in an xDS `Any`.
pub fn decode_any(any: &EnvoyAny, hint: &str) -> Result<Received, DecodeError> {
    if any.type_url != proto::MCP_RESOURCE_TYPE_URL {
        return Err(DecodeError::EnvelopeTypeUrl {
            resource: hint.to_string(),
            got: any.type_url.clone(),
            expected: proto::MCP_RESOURCE_TYPE_URL,
        });
    }
    let res = Resource::decode(any.value.as_slice()).map_err(|source| DecodeError::Resource {
        resource: hint.to_string(),
        source,
    })?;
    decode_resource(res, hint)
}

/// The change a SotW xDS response makes: it always holds the full set.
pub fn change_from_sotw(resp: &DiscoveryResponse) -> Result<Change, DecodeError> {
    let resources = resp
        .resources
        .iter()
        .enumerate()
        .map(|(i, any)| decode_any(any, &format!("#{i}")))
        .collect::<Result<_, _>>()?;
    Ok(Change::Replace(resources))
}

/// The change a delta xDS response makes: upserts and removals.
pub fn change_from_delta(resp: &DeltaDiscoveryResponse) -> Result<Change, DecodeError> {
    let upserts = resp
        .resources
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let hint = if r.name.is_empty() {
                format!("#{i}")
            } else {
                r.name.clone()
            };
            let any = r
                .resource
                .as_ref()
                .ok_or_else(|| DecodeError::EmptyEnvelope {
                    resource: hint.clone(),
                })?;
            decode_any(any, &hint)
        })
        .collect::<Result<_, _>>()?;
    Ok(Change::Patch {
        upserts,
        removals: resp.removed_resources.clone(),
    })
}

/// The change a legacy MCP response makes: a patch when the server marked it incremental,
/// otherwise the full set.
pub fn change_from_mcp(resp: Resources) -> Result<Change, DecodeError> {
    let resources = resp
        .resources
        .into_iter()
        .enumerate()
        .map(|(i, r)| decode_resource(r, &format!("#{i}")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(if resp.incremental {
        Change::Patch {
            upserts: resources,
            removals: resp.removed_resources,
        }
    } else {
        Change::Replace(resources)
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::discovery::v3::Resource as DeltaResource;
    use proto::istio::mcp::v1alpha1::Metadata;

    fn mcp_resource(name: &str, version: &str, host: &str) -> Resource {
        let spec = ServiceEntry {
            hosts: vec![host.to_string()],
            ..Default::default()
        };
        Resource {
            metadata: Some(Metadata {
                name: name.to_string(),
                version: version.to_string(),
                create_time: Some(prost_types::Timestamp {
                    seconds: 1_700_000_000,
                    nanos: 5_000_000,
                }),
                labels: [("app".to_string(), "x".to_string())].into(),
                ..Default::default()
            }),
            body: Some(prost_types::Any {
                type_url: proto::SERVICE_ENTRY_TYPE_URL.to_string(),
                value: spec.encode_to_vec(),
            }),
        }
    }

    fn any(res: &Resource) -> EnvoyAny {
        EnvoyAny {
            type_url: proto::MCP_RESOURCE_TYPE_URL.to_string(),
            value: res.encode_to_vec(),
        }
    }

    fn names(state: &BTreeMap<String, Received>) -> Vec<&str> {
        state.keys().map(String::as_str).collect()
    }

    #[test]
    fn decodes_metadata_and_body() {
        let r = decode_resource(mcp_resource("ns1/a", "v7", "a.example.com"), "#0").unwrap();
        assert_eq!(r.name, "ns1/a");
        assert_eq!(r.namespace, "ns1");
        assert_eq!(r.short_name, "a");
        assert_eq!(r.version, "v7");
        assert_eq!(r.labels.get("app").map(String::as_str), Some("x"));
        assert_eq!(r.spec.hosts, vec!["a.example.com"]);
        let t = r.create_time.unwrap();
        let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap();
        assert_eq!(d.as_secs(), 1_700_000_000);
        assert_eq!(d.subsec_millis(), 5);
    }

    #[test]
    fn sotw_replaces_then_delta_patches() {
        let mut state = BTreeMap::new();
        let full = DiscoveryResponse {
            version_info: "1".into(),
            resources: vec![
                any(&mcp_resource("ns/a", "1", "a")),
                any(&mcp_resource("ns/b", "1", "b")),
                any(&mcp_resource("other/c", "1", "c")),
            ],
            ..Default::default()
        };
        let applied = apply(&mut state, change_from_sotw(&full).unwrap());
        assert_eq!(names(&state), vec!["ns/a", "ns/b", "other/c"]);
        assert_eq!(applied.upserted, vec!["ns/a", "ns/b", "other/c"]);
        assert!(applied.removed.is_empty());

        // A second full response: omission of ns/b means deletion.
        let full2 = DiscoveryResponse {
            resources: vec![
                any(&mcp_resource("ns/a", "2", "a2")),
                any(&mcp_resource("other/c", "1", "c")),
            ],
            ..Default::default()
        };
        let applied = apply(&mut state, change_from_sotw(&full2).unwrap());
        assert_eq!(names(&state), vec!["ns/a", "other/c"]);
        assert_eq!(applied.removed, vec!["ns/b"]);
        assert_eq!(state["ns/a"].spec.hosts, vec!["a2"]);

        // Delta: upsert d, change c, remove a.
        let delta = DeltaDiscoveryResponse {
            resources: vec![
                DeltaResource {
                    name: "ns/d".into(),
                    version: "3".into(),
                    resource: Some(any(&mcp_resource("ns/d", "3", "d"))),
                    ..Default::default()
                },
                DeltaResource {
                    name: "other/c".into(),
                    version: "3".into(),
                    resource: Some(any(&mcp_resource("other/c", "3", "c3"))),
                    ..Default::default()
                },
            ],
            removed_resources: vec!["ns/a".into()],
            ..Default::default()
        };
        let applied = apply(&mut state, change_from_delta(&delta).unwrap());
        assert_eq!(names(&state), vec!["ns/d", "other/c"]);
        assert_eq!(applied.upserted, vec!["ns/d", "other/c"]);
        assert_eq!(applied.removed, vec!["ns/a"]);
        assert_eq!(state["other/c"].version, "3");
        assert_eq!(state["other/c"].spec.hosts, vec!["c3"]);
    }

    #[test]
    fn mcp_incremental_flag_selects_patch_or_replace() {
        let mut state = BTreeMap::new();
        let full = Resources {
            collection: "istio/networking/v1alpha3/serviceentries".into(),
            resources: vec![
                mcp_resource("ns/a", "1", "a"),
                mcp_resource("ns/b", "1", "b"),
            ],
            ..Default::default()
        };
        apply(&mut state, change_from_mcp(full).unwrap());
        assert_eq!(names(&state), vec!["ns/a", "ns/b"]);

        let inc = Resources {
            resources: vec![mcp_resource("ns/c", "2", "c")],
            removed_resources: vec!["ns/a".into()],
            incremental: true,
            ..Default::default()
        };
        apply(&mut state, change_from_mcp(inc).unwrap());
        assert_eq!(names(&state), vec!["ns/b", "ns/c"]);

        let replace = Resources {
            resources: vec![mcp_resource("ns/z", "3", "z")],
            ..Default::default()
        };
        let applied = apply(&mut state, change_from_mcp(replace).unwrap());
        assert_eq!(names(&state), vec!["ns/z"]);
        assert_eq!(applied.removed, vec!["ns/b", "ns/c"]);
    }

    #[test]
    fn decode_errors_name_the_resource() {
        let mut bad = mcp_resource("ns/broken", "1", "x");
        if let Some(body) = bad.body.as_mut() {
            body.value = vec![0xff, 0xff, 0xff];
        }
        let resp = DiscoveryResponse {
            resources: vec![any(&mcp_resource("ns/ok", "1", "ok")), any(&bad)],
            ..Default::default()
        };
        let err = change_from_sotw(&resp).unwrap_err();
        assert!(matches!(err, DecodeError::Body { .. }));
        assert!(err.to_string().contains("ns/broken"), "{err}");

        let mut wrong = mcp_resource("ns/wrong", "1", "x");
        if let Some(body) = wrong.body.as_mut() {
            body.type_url = "type.googleapis.com/istio.networking.v1alpha3.Gateway".into();
        }
        let err = decode_resource(wrong, "#0").unwrap_err();
        assert!(err.to_string().contains("ns/wrong"), "{err}");

        let garbage = EnvoyAny {
            type_url: proto::MCP_RESOURCE_TYPE_URL.into(),
            value: vec![0xff],
        };
        let err = decode_any(&garbage, "#4").unwrap_err();
        assert!(err.to_string().contains("#4"), "{err}");

        let delta = DeltaDiscoveryResponse {
            resources: vec![DeltaResource {
                name: "ns/empty".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let err = change_from_delta(&delta).unwrap_err();
        assert!(err.to_string().contains("ns/empty"), "{err}");
    }
}
