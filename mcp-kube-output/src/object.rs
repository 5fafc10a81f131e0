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

    /// Whether an object with these labels is this process's.
    pub fn owns(&self, labels: &BTreeMap<String, String>) -> bool {
        let is = |k: &str, v: &str| labels.get(k).is_some_and(|l| l == v);
        is(LABEL_MANAGED_BY, MANAGED_BY)
            && is(LABEL_REGISTRY, &self.registry)
            && is(LABEL_SOURCE, &self.source)
            && self
                .only_shard
                .as_deref()
                .is_none_or(|s| is(LABEL_SHARD, s))
    }
}

/// Why an entry could not be rendered (its bytes are not a ServiceEntry resource: a bug).
#[derive(Debug, thiserror::Error)]
#[error("entry {name}: cannot decode its resource: {source}")]
pub struct RenderError {
    name: String,
    source: prost::DecodeError,
}

/// The object to apply for `entry`, labelled with `shard` (`<i>-of-<n>`) when sharded.
pub fn render(entry: &Entry, shard: Option<&str>) -> Result<Value, RenderError> {
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
    Ok(json!({
        "apiVersion": API_VERSION,
        "kind": "ServiceEntry",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec_json(&spec),
    }))
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
        let obj = render(&entry, Some("1-of-4")).expect("renders");
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
        assert_eq!(
            owner.selector(),
            format!(
                "app.kubernetes.io/managed-by=mcp-adapter,{LABEL_REGISTRY}={},{LABEL_SOURCE}={}",
                owner.registry, owner.source
            )
        );
    }
}
