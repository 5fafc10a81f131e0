//! The registry-neutral service model every adapter produces.
//!
//! Adapters convert their registry's objects into [`Service`]s; only `translate` turns them into
//! Istio ServiceEntries. Nothing here knows protobuf. Collections are ordered (`BTreeMap`, sorted
//! `Vec`s) so that equal services hash and encode identically on every replica.
//!
//! Endpoints are the bulk of a large registry (1M of them), so what they repeat is shared rather
//! than copied: labels are a [`LabelSet`] and network, locality and service account are
//! [`SharedStr`]s, both interned process-wide.

mod intern;
mod shared;

use std::collections::BTreeMap;
use std::time::SystemTime;

pub use shared::{Iter as LabelIter, LabelSet, SharedStr};

/// Labels or annotations: ordered so that hashing and encoding are deterministic.
pub type Labels = BTreeMap<String, String>;

/// Identity of a service inside one source.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    /// Target namespace; `None` means the adapter's `--namespace`.
    pub namespace: Option<String>,
    /// Resource name; mapped to a valid Kubernetes name by `translate`.
    pub name: String,
}

impl ServiceKey {
    /// A key in the adapter's default namespace.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            namespace: None,
            name: name.into(),
        }
    }

    /// A key in an explicit namespace.
    pub fn namespaced(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: Some(namespace.into()),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{ns}/{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// A host name as the registry gives it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Host {
    /// A registry name (`web`, `providers:com.foo.Api`): mapped to a DNS label sequence and
    /// completed with the adapter's `--host-suffix`.
    Relative(String),
    /// A complete host name written by a person (file adapter): validated, lower-cased, never
    /// rewritten otherwise.
    Absolute(String),
}

/// Where the service lives relative to the mesh.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Location {
    /// Outside the mesh (no sidecars).
    External,
    /// Part of the mesh.
    #[default]
    Internal,
}

/// How the proxy resolves endpoints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Resolution {
    /// Pass-through: no endpoints.
    None,
    /// Endpoint addresses are IPs.
    #[default]
    Static,
    /// Endpoint addresses (or hosts) are resolved by DNS.
    Dns,
    /// DNS, one connection per resolved address.
    DnsRoundRobin,
}

/// One service port.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Port {
    /// Port number, 1-65535.
    pub number: u32,
    /// Port name; must be a unique DNS label (validated in `translate`).
    pub name: String,
    /// Istio protocol name (`HTTP`, `GRPC`, `TCP`, ...); `None` lets Istio sniff.
    pub protocol: Option<String>,
    /// Port the endpoints listen on, when different from `number`.
    pub target_port: Option<u32>,
}

/// One instance of a service.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// IP address (STATIC) or host name (DNS resolutions).
    pub address: String,
    /// Port name -> port number on this endpoint, for ports that differ from the service port.
    /// Usually empty, and an empty map allocates nothing.
    pub ports: BTreeMap<String, u32>,
    /// Endpoint labels (invalid ones are dropped by `translate`), shared with every endpoint
    /// that has the same ones: build with `labels.into()` from a [`Labels`] map.
    pub labels: LabelSet,
    /// Network name for multi-network meshes.
    pub network: Option<SharedStr>,
    /// `region/zone/subzone`.
    pub locality: Option<SharedStr>,
    /// Load-balancing weight; `None` = Istio's default.
    pub weight: Option<u32>,
    /// Service account of the workload.
    pub service_account: Option<SharedStr>,
}

/// One service: everything a ServiceEntry and its MCP metadata carry.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Service {
    /// Identity within the source.
    pub key: ServiceKey,
    /// Where the service came from, for error messages (`file a.yaml, document 2`,
    /// `consul service web`). Not part of the content.
    pub origin: String,
    /// Host names; at least one.
    pub hosts: Vec<Host>,
    /// Virtual IPs or CIDRs.
    pub addresses: Vec<String>,
    /// Service ports.
    pub ports: Vec<Port>,
    /// Inside or outside the mesh.
    pub location: Location,
    /// Endpoint resolution.
    pub resolution: Resolution,
    /// Instances.
    pub endpoints: Vec<Endpoint>,
    /// Namespaces the ServiceEntry is visible in; empty = the adapter's `--export-to`.
    pub export_to: Vec<String>,
    /// SANs the workloads' certificates carry.
    pub subject_alt_names: Vec<String>,
    /// Select WorkloadEntries/pods by labels instead of listing endpoints.
    pub workload_selector: Option<Labels>,
    /// Resource labels (the core adds registry type and source).
    pub labels: Labels,
    /// Resource annotations.
    pub annotations: Labels,
    /// The registry's own creation time, if it has one.
    pub create_time: Option<SystemTime>,
    /// The registry's own parts of this service's name beyond the service itself (Nacos'
    /// `group` and `namespace`, ...), for `--host-template`; `service` is the relative host
    /// unless given here. Raw registry text: the template maps it.
    pub name_parts: Vec<(&'static str, String)>,
    /// Where the registry's own records place this service's creation among the others of the
    /// source (Consul `CreateIndex`, ZooKeeper `czxid`, ...), if they do. Only compared, never
    /// shown: it decides which of two services wanting one virtual IP keeps it (`vip`), so that
    /// replicas and restarts agree without sharing any history.
    pub creation_order: Option<CreationOrder>,
}

/// A registry fact ordering services by creation: smaller is older. `primary` is the fact
/// itself (a Raft index, a zxid, Unix milliseconds); `secondary` breaks ties the registry itself
/// can break (a hash of a Kubernetes `uid` for objects created within one second), else 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CreationOrder {
    /// The registry's creation fact.
    pub primary: u64,
    /// A tie-break the registry provides, else 0.
    pub secondary: u64,
}

impl CreationOrder {
    /// An order from one fact.
    pub const fn new(primary: u64) -> Self {
        Self {
            primary,
            secondary: 0,
        }
    }

    /// An order from a time (Unix milliseconds; before 1970 counts as 1970).
    pub fn of_time(t: SystemTime) -> Self {
        let ms = t
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Self::new(ms)
    }
}

impl Service {
    /// A service with one relative host named after the key, and nothing else set.
    pub fn new(key: ServiceKey, origin: impl Into<String>) -> Self {
        let host = Host::Relative(key.name.clone());
        Self {
            key,
            origin: origin.into(),
            hosts: vec![host],
            addresses: Vec::new(),
            ports: Vec::new(),
            location: Location::Internal,
            resolution: Resolution::Static,
            endpoints: Vec::new(),
            export_to: Vec::new(),
            subject_alt_names: Vec::new(),
            workload_selector: None,
            labels: Labels::new(),
            annotations: Labels::new(),
            create_time: None,
            name_parts: Vec::new(),
            creation_order: None,
        }
    }

    /// Content hash (everything but `origin`), used to skip re-listed services that did not change.
    /// Deterministic and a function of content only: shared values hash by content (a label set
    /// feeds its precomputed content hash), so equal services hash equal however they were built.
    pub fn content_hash(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        self.key.hash(&mut h);
        self.hosts.hash(&mut h);
        self.addresses.hash(&mut h);
        self.ports.hash(&mut h);
        self.location.hash(&mut h);
        self.resolution.hash(&mut h);
        self.endpoints.hash(&mut h);
        self.export_to.hash(&mut h);
        self.subject_alt_names.hash(&mut h);
        self.workload_selector.hash(&mut h);
        self.labels.hash(&mut h);
        self.annotations.hash(&mut h);
        self.create_time.hash(&mut h);
        self.name_parts.hash(&mut h);
        self.creation_order.hash(&mut h);
        h.finish()
    }
}
