//! A served entry as the ServiceEntry object the output applies, and the labels that say which
//! objects are this adapter's.
//!
//! The object is rendered from the entry's encoded bytes, the very resource MCP sends, so the
//! two outputs cannot disagree: its spec is `cache::json::spec_json` of that ServiceEntry, its
//! labels and annotations are the MCP metadata's plus the ownership labels below and the entry's
//! version (so a restart or a new leader can tell from a metadata-only list what is current).

use std::collections::BTreeMap;

use prost::Message;
use proto::istio::mcp::v1alpha1::Resource;
use proto::istio::networking::v1alpha3::ServiceEntry;
use serde_json::{json, Value};

use mcp_core::cache::json::{spec_json, API_VERSION};
use mcp_core::cache::Entry;
use mcp_core::translate::{label_safe, LABEL_REGISTRY, LABEL_SOURCE};

/// Server-side apply field manager: one for every replica and adapter, so replicas applying the
/// same content never conflict.
pub const FIELD_MANAGER: &str = "mcp-adapter";

/// `app.kubernetes.io/managed-by` value on every object the output writes.
pub const MANAGED_BY: &str = "mcp-adapter";

const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// The shard label (`<i>-of-<n>`) with `--shard` or `--shards`.
pub const LABEL_SHARD: &str = "mcp-adapter/shard";

/// The entry version the object was written from.
pub const ANNOTATION_VERSION: &str = "mcp-adapter/version";

/// The Lease (`namespace/name`) its writer held: an object with this adapter's labels under
/// another Lease whose holder is alive belongs to another adapter (a second adapter of this
/// registry with the same `--source-name`, or the other shard layout during a change).
pub const ANNOTATION_LEASE: &str = "mcp-adapter/lease";

/// The fingerprint of its writer's serving flags: an object under a Lease no one holds any more
/// is taken over only by the same adapter (the same fingerprint) or another shard layout of it,
/// never by a differently configured adapter that happens to carry the same labels.
pub const ANNOTATION_CONFIG: &str = "mcp-adapter/config";

/// What every object written by this process carries besides its content: the Lease it was
/// written under (`namespace/name`) and the writer's fingerprint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stamp {
    /// The Lease.
    pub lease: String,
    /// The fingerprint.
    pub config: String,
}

/// Whose objects these are: the labels every object of this adapter carries and the selector
/// that lists them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// `mcp-adapter/registry` value.
    pub registry: String,
    /// `mcp-adapter/source` value.
    pub source: String,
    /// `--shard i/n` of a process that serves one shard: it owns only that shard's objects.
    pub only_shard: Option<String>,
}

impl Owner {
    /// The owner for a registry type and `--source-name` (mapped to label values as the MCP
    /// labels are).
    pub fn new(registry: &str, source: &str, only_shard: Option<String>) -> Owner {
        Owner {
            registry: label_safe(registry),
            source: label_safe(source),
            only_shard,
        }
    }

    /// Label selector of the objects this process owns.
    pub fn selector(&self) -> String {
        let mut s = format!(
            "{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_REGISTRY}={},{LABEL_SOURCE}={}",
            self.registry, self.source
        );
        if let Some(shard) = &self.only_shard {
            s.push_str(&format!(",{LABEL_SHARD}={shard}"));
        }
        s
    }

    /// Whether an object with these labels is this process's (of its family and shard).
    pub fn owns(&self, labels: &BTreeMap<String, String>) -> bool {
        self.family(labels)
            && self
                .only_shard
                .as_deref()
                .is_none_or(|s| labels.get(LABEL_SHARD).is_some_and(|l| l == s))
    }

    /// Whether an object with these labels was written for this registry and source (by this
    /// process, a sibling shard or another shard layout).
    fn family(&self, labels: &BTreeMap<String, String>) -> bool {
        let is = |k: &str, v: &str| labels.get(k).is_some_and(|l| l == v);
        is(LABEL_MANAGED_BY, MANAGED_BY)
            && is(LABEL_REGISTRY, &self.registry)
            && is(LABEL_SOURCE, &self.source)
    }

    /// Whose an object is, from its labels and annotations, for this process writing under
    /// `lease` (`namespace/name`).
    pub fn classify(
        &self,
        lease: &str,
        labels: &BTreeMap<String, String>,
        annotations: &BTreeMap<String, String>,
    ) -> Claim {
        if !self.family(labels) {
            return Claim::NotOurs;
        }
        let shard = labels.get(LABEL_SHARD).map(String::as_str);
        let other_layout = match (&self.only_shard, shard) {
            (None, _) => false,
            (Some(mine), Some(theirs)) if mine == theirs => false,
            (Some(mine), Some(theirs)) if same_count(mine, theirs) => return Claim::Sibling,
            (Some(_), _) => true,
        };
        match annotations.get(ANNOTATION_LEASE) {
            Some(other) if other != lease => Claim::OtherLease {
                lease: other.clone(),
                other_layout,
            },
            _ if other_layout => Claim::Stranded,
            _ => Claim::Ours,
        }
    }
}

/// Whose a listed object is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// This process's.
    Ours,
    /// Of this adapter under another shard layout (or before `--shard`), by no other live
    /// writer: taken over if served here, deleted once unclaimed at a second list.
    Stranded,
    /// Of a sibling shard process (same layout, another index): not this process's business.
    Sibling,
    /// Written under another Lease: another adapter's while that Lease's holder lives, else
    /// (its writer is gone) this process's, or stranded when of another layout.
    OtherLease {
        /// The Lease, `namespace/name`.
        lease: String,
        /// Of another shard layout.
        other_layout: bool,
    },
    /// Not written for this registry and source: a user's or another adapter's.
    NotOurs,
}

/// Whether two shard labels (`<i>-of-<n>`) are of one layout (one `n`).
fn same_count(a: &str, b: &str) -> bool {
    let count = |s: &str| s.rsplit_once("-of-").map(|(_, n)| n.to_string());
    count(a).is_some() && count(a) == count(b)
}

/// Why an entry could not be rendered (its bytes are not a ServiceEntry resource: a bug).
#[derive(Debug, thiserror::Error)]
#[error("entry {name}: cannot decode its resource: {source}")]
pub struct RenderError {
    name: String,
    source: prost::DecodeError,
}

/// The object to apply for `entry`, labelled with `shard` (`<i>-of-<n>`) when sharded, stamped
/// with its writer; with `uid`, the apply is refused unless the object is still that one.
pub fn render(
    entry: &Entry,
    shard: Option<&str>,
    stamp: &Stamp,
    uid: Option<&str>,
) -> Result<Value, RenderError> {
    let bad = |source| RenderError {
        name: entry.name.to_string(),
        source,
    };
    let resource = Resource::decode(entry.resource.clone()).map_err(bad)?;
    let spec = match &resource.body {
        Some(body) => ServiceEntry::decode(body.value.as_slice()).map_err(bad)?,
        None => ServiceEntry::default(),
    };
    let meta = resource.metadata.unwrap_or_default();
    let (namespace, name) = split_name(&entry.name);
    let mut labels: BTreeMap<String, String> = meta.labels.into_iter().collect();
    labels.insert(LABEL_MANAGED_BY.into(), MANAGED_BY.into());
    if let Some(shard) = shard {
        labels.insert(LABEL_SHARD.into(), shard.into());
    }
    let mut annotations: BTreeMap<String, String> = meta.annotations.into_iter().collect();
    annotations.insert(ANNOTATION_VERSION.into(), entry.version.to_string());
    annotations.insert(ANNOTATION_LEASE.into(), stamp.lease.clone());
    annotations.insert(ANNOTATION_CONFIG.into(), stamp.config.clone());
    let mut obj = json!({
        "apiVersion": API_VERSION,
        "kind": "ServiceEntry",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec_json(&spec),
    });
    if let Some(uid) = uid.filter(|u| !u.is_empty()) {
        obj["metadata"]["uid"] = json!(uid);
    }
    Ok(obj)
}

/// `namespace/name` as its two parts (every served name has both).
pub fn split_name(name: &str) -> (&str, &str) {
    name.split_once('/').unwrap_or(("", name))
}

/// `<i>-of-<n>`, the shard label value.
pub fn shard_label(index: usize, count: usize) -> String {
    format!("{index}-of-{count}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcp_core::cache::encode;
    use mcp_core::testing::mk_service;
    use mcp_core::translate::{test_config, translate};

    #[test]
    fn render_is_the_mcp_resource_with_ownership() {
        let cfg = test_config(mcp_core::OnEmpty::Keep, mcp_core::vip::VipCidr::Off);
        let t = translate(mk_service("web", 2), &cfg).expect("valid");
        let entry = encode(&t);
        let stamp = Stamp {
            lease: "ns/lease".into(),
            config: "0123456789abcdef".into(),
        };
        let obj = render(&entry, Some("1-of-4"), &stamp, None).expect("renders");
        assert_eq!(obj["metadata"]["annotations"][ANNOTATION_LEASE], "ns/lease");
        assert_eq!(
            obj["metadata"]["annotations"][ANNOTATION_CONFIG],
            "0123456789abcdef"
        );
        assert!(obj["metadata"].get("uid").is_none());
        let forced = render(&entry, Some("1-of-4"), &stamp, Some("u-1")).expect("renders");
        assert_eq!(forced["metadata"]["uid"], "u-1");
        assert_eq!(obj["metadata"]["namespace"], "ns");
        assert_eq!(obj["metadata"]["name"], "web");
        let labels = &obj["metadata"]["labels"];
        assert_eq!(labels[LABEL_MANAGED_BY], MANAGED_BY);
        assert_eq!(labels[LABEL_SHARD], "1-of-4");
        assert_eq!(labels[LABEL_REGISTRY], t.labels[LABEL_REGISTRY]);
        assert_eq!(
            obj["metadata"]["annotations"][ANNOTATION_VERSION],
            &*entry.version
        );
        assert_eq!(obj["spec"]["endpoints"].as_array().map(Vec::len), Some(2));
        assert_eq!(obj["spec"]["hosts"], json!(t.spec.hosts));

        let owner = Owner::new(&t.labels[LABEL_REGISTRY], &t.labels[LABEL_SOURCE], None);
        let labels: BTreeMap<String, String> =
            serde_json::from_value(labels.clone()).expect("labels");
        assert!(owner.owns(&labels));
        let only_2 = Owner {
            only_shard: Some("2-of-4".into()),
            ..owner.clone()
        };
        assert!(!only_2.owns(&labels));
        let mut other = labels.clone();
        other.insert(LABEL_SOURCE.into(), "someone-else".into());
        assert!(!owner.owns(&other));
        // Classification: ours, a sibling shard's, another layout's, another Lease's.
        let ann = |lease: &str| -> BTreeMap<String, String> {
            [(ANNOTATION_LEASE.to_string(), lease.to_string())].into()
        };
        let shard_0_of_2 = Owner {
            only_shard: Some("0-of-2".into()),
            ..owner.clone()
        };
        let with_shard = |s: &str| {
            let mut l = labels.clone();
            l.insert(LABEL_SHARD.into(), s.into());
            l
        };
        assert_eq!(owner.classify("ns/l", &labels, &ann("ns/l")), Claim::Ours);
        assert_eq!(
            owner.classify("ns/l", &labels, &BTreeMap::new()),
            Claim::Ours
        );
        assert_eq!(owner.classify("ns/l", &other, &ann("ns/l")), Claim::NotOurs);
        assert_eq!(
            owner.classify("ns/l", &labels, &ann("b/l")),
            Claim::OtherLease {
                lease: "b/l".into(),
                other_layout: false
            }
        );
        assert_eq!(
            shard_0_of_2.classify("ns/l", &with_shard("1-of-2"), &ann("ns/x")),
            Claim::Sibling
        );
        assert_eq!(
            shard_0_of_2.classify("ns/l", &with_shard("0-of-2"), &ann("ns/l")),
            Claim::Ours
        );
        assert_eq!(
            shard_0_of_2.classify("ns/l", &with_shard("2-of-3"), &BTreeMap::new()),
            Claim::Stranded
        );
        assert_eq!(
            shard_0_of_2.classify("ns/l", &with_shard("2-of-3"), &ann("ns/x")),
            Claim::OtherLease {
                lease: "ns/x".into(),
                other_layout: true
            }
        );
        assert_eq!(
            shard_0_of_2.classify("ns/l", &labels, &ann("ns/l")),
            Claim::Stranded,
            "unsharded objects are another layout's"
        );
        assert_eq!(
            owner.selector(),
            format!(
                "app.kubernetes.io/managed-by=mcp-adapter,{LABEL_REGISTRY}={},{LABEL_SOURCE}={}",
                owner.registry, owner.source
            )
        );
    }
}
