//! What the watches have told us about the cluster: Services, the EndpointSlices joined to them
//! by their `kubernetes.io/service-name` label, and (when read) node topology and pod details.
//!
//! Every change returns the keys of the Services it touches, so the watch loop converts only
//! those. Objects are kept as the API server sent them, except pods and nodes, of which only the
//! few fields the conversion reads are kept (a pod object is kilobytes; its labels and service
//! account are what matter).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, Pod, Service as KubeService};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::core::PartialObjectMeta;
use kube::ResourceExt;
use mcp_core::{LabelSet, SharedStr};

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// `(namespace, name)` of a namespaced object.
pub type ObjKey = (String, String);

/// Node labels that give an endpoint's locality.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Topology {
    /// `topology.kubernetes.io/region`.
    pub region: Option<String>,
    /// `topology.kubernetes.io/zone`.
    pub zone: Option<String>,
    /// `topology.istio.io/subzone`.
    pub subzone: Option<String>,
}

impl Topology {
    /// Reads the labels of a node.
    pub fn of(node: &PartialObjectMeta<Node>) -> Self {
        let labels = node.labels();
        let get = |k: &str| labels.get(k).filter(|v| !v.is_empty()).cloned();
        Self {
            region: get("topology.kubernetes.io/region"),
            zone: get("topology.kubernetes.io/zone"),
            subzone: get("topology.istio.io/subzone"),
        }
    }
}

/// What the conversion needs of a pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodInfo {
    /// The pod's labels (endpoint labels, for DestinationRule subsets), shared with its
    /// endpoints and with every pod that has the same ones.
    pub labels: LabelSet,
    /// `spec.serviceAccountName`.
    pub service_account: Option<SharedStr>,
}

impl PodInfo {
    /// Reads a pod.
    pub fn of(pod: &Pod) -> Self {
        Self {
            labels: pod.labels().into(),
            service_account: pod
                .spec
                .as_ref()
                .and_then(|s| s.service_account_name.as_deref())
                .filter(|s| !s.is_empty())
                .map(SharedStr::from),
        }
    }
}

/// One object from any of the watches, reduced to what is kept.
#[derive(Clone, Debug)]
pub enum Item {
    /// A Service.
    Service(Box<KubeService>),
    /// An EndpointSlice.
    Slice(Box<EndpointSlice>),
    /// A node by name.
    Node(String, Topology),
    /// A pod by namespace and name.
    Pod(ObjKey, PodInfo),
}

/// Which watch an item comes from: a re-list replaces that kind's objects in the watch's scope.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Services.
    Services,
    /// EndpointSlices.
    Slices,
    /// Nodes.
    Nodes,
    /// Pods.
    Pods,
}

#[derive(Debug)]
struct SliceEntry {
    service: ObjKey,
    pods: BTreeSet<ObjKey>,
    slice: EndpointSlice,
}

/// The joined view.
#[derive(Debug, Default)]
pub struct Cluster {
    services: BTreeMap<ObjKey, KubeService>,
    slices: BTreeMap<ObjKey, SliceEntry>,
    /// Service -> the keys of its slices.
    by_service: BTreeMap<ObjKey, BTreeSet<ObjKey>>,
    nodes: BTreeMap<String, Topology>,
    pods: BTreeMap<ObjKey, PodInfo>,
    /// Which slices name a pod as an endpoint's target.
    pod_slices: BTreeMap<ObjKey, BTreeSet<ObjKey>>,
}

fn key_of<K: ResourceExt>(o: &K) -> ObjKey {
    (o.namespace().unwrap_or_default(), o.name_any())
}

impl Cluster {
    /// Every Service key.
    pub fn service_keys(&self) -> Vec<ObjKey> {
        self.services.keys().cloned().collect()
    }

    /// A Service.
    pub fn service(&self, key: &ObjKey) -> Option<&KubeService> {
        self.services.get(key)
    }

    /// The EndpointSlices of a Service, by slice name.
    pub fn slices_of<'a>(&'a self, key: &ObjKey) -> impl Iterator<Item = &'a EndpointSlice> + 'a {
        self.by_service
            .get(key)
            .into_iter()
            .flatten()
            .filter_map(|slice| self.slices.get(slice))
            .map(|e| &e.slice)
    }

    /// A node's topology, when nodes are read.
    pub fn node(&self, name: &str) -> Option<&Topology> {
        self.nodes.get(name)
    }

    /// A pod, when pods are read.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&PodInfo> {
        self.pods.get(&(namespace.to_string(), name.to_string()))
    }

    /// Adds or replaces an object; the Services whose conversion may have changed.
    pub fn apply(&mut self, item: Item) -> Vec<ObjKey> {
        match item {
            Item::Service(svc) => {
                let key = key_of(svc.as_ref());
                self.services.insert(key.clone(), *svc);
                vec![key]
            }
            Item::Slice(slice) => {
                let mut touched = self.remove_slice(&key_of(slice.as_ref()));
                touched.extend(self.insert_slice(*slice));
                touched.sort();
                touched.dedup();
                touched
            }
            Item::Node(name, topo) => {
                if self.nodes.get(&name) == Some(&topo) {
                    return Vec::new();
                }
                self.nodes.insert(name.clone(), topo);
                self.services_on_node(&name)
            }
            Item::Pod(key, info) => {
                if self.pods.get(&key) == Some(&info) {
                    return Vec::new();
                }
                self.pods.insert(key.clone(), info);
                self.services_of_pod(&key)
            }
        }
    }

    /// Removes an object; the Services whose conversion may have changed.
    pub fn delete(&mut self, item: Item) -> Vec<ObjKey> {
        match item {
            Item::Service(svc) => {
                let key = key_of(svc.as_ref());
                self.services.remove(&key);
                vec![key]
            }
            Item::Slice(slice) => self.remove_slice(&key_of(slice.as_ref())),
            Item::Node(name, _) => {
                if self.nodes.remove(&name).is_none() {
                    return Vec::new();
                }
                self.services_on_node(&name)
            }
            Item::Pod(key, _) => {
                if self.pods.remove(&key).is_none() {
                    return Vec::new();
                }
                self.services_of_pod(&key)
            }
        }
    }

    /// Replaces every object of `kind` in `scope` (a namespace; `None` = all) with `items`, as
    /// after a (re-)list.
    pub fn replace(&mut self, kind: Kind, scope: Option<&str>, items: Vec<Item>) {
        let in_scope = |ns: &str| scope.is_none_or(|s| s == ns);
        match kind {
            Kind::Services => self.services.retain(|(ns, _), _| !in_scope(ns)),
            Kind::Slices => {
                let gone: Vec<ObjKey> = self
                    .slices
                    .keys()
                    .filter(|(ns, _)| in_scope(ns))
                    .cloned()
                    .collect();
                for key in gone {
                    self.remove_slice(&key);
                }
            }
            Kind::Nodes => self.nodes.clear(),
            Kind::Pods => self.pods.retain(|(ns, _), _| !in_scope(ns)),
        }
        for item in items {
            self.apply(item);
        }
    }

    fn insert_slice(&mut self, slice: EndpointSlice) -> Vec<ObjKey> {
        let (ns, name) = key_of(&slice);
        let Some(svc) = slice.labels().get(SERVICE_NAME_LABEL).cloned() else {
            // Not managed for a Service (a slice someone wrote by hand without the label):
            // nothing to join it to.
            return Vec::new();
        };
        let service = (ns.clone(), svc);
        let pods: BTreeSet<ObjKey> = slice
            .endpoints
            .iter()
            .filter_map(|e| e.target_ref.as_ref())
            .filter(|r| r.kind.as_deref() == Some("Pod"))
            .filter_map(|r| {
                let pod_ns = r.namespace.clone().unwrap_or_else(|| ns.clone());
                r.name.clone().map(|n| (pod_ns, n))
            })
            .collect();
        for pod in &pods {
            self.pod_slices
                .entry(pod.clone())
                .or_default()
                .insert((ns.clone(), name.clone()));
        }
        self.by_service
            .entry(service.clone())
            .or_default()
            .insert((ns.clone(), name.clone()));
        self.slices.insert(
            (ns, name),
            SliceEntry {
                service: service.clone(),
                pods,
                slice,
            },
        );
        vec![service]
    }

    fn remove_slice(&mut self, key: &ObjKey) -> Vec<ObjKey> {
        let Some(entry) = self.slices.remove(key) else {
            return Vec::new();
        };
        for pod in &entry.pods {
            if let Some(set) = self.pod_slices.get_mut(pod) {
                set.remove(key);
                if set.is_empty() {
                    self.pod_slices.remove(pod);
                }
            }
        }
        if let Some(set) = self.by_service.get_mut(&entry.service) {
            set.remove(key);
            if set.is_empty() {
                self.by_service.remove(&entry.service);
            }
        }
        vec![entry.service]
    }

    fn services_of_pod(&self, pod: &ObjKey) -> Vec<ObjKey> {
        let mut out: Vec<ObjKey> = self
            .pod_slices
            .get(pod)
            .into_iter()
            .flatten()
            .filter_map(|s| self.slices.get(s))
            .map(|e| e.service.clone())
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Nodes change rarely (their topology labels almost never): a scan is cheaper than an index.
    fn services_on_node(&self, node: &str) -> Vec<ObjKey> {
        let mut out: Vec<ObjKey> = self
            .slices
            .values()
            .filter(|e| {
                e.slice
                    .endpoints
                    .iter()
                    .any(|ep| ep.node_name.as_deref() == Some(node))
            })
            .map(|e| e.service.clone())
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::discovery::v1::Endpoint as SliceEndpoint;
    use kube::api::ObjectMeta;

    fn slice(ns: &str, name: &str, svc: &str, pod: &str) -> Item {
        Item::Slice(Box::new(EndpointSlice {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                labels: Some([(SERVICE_NAME_LABEL.to_string(), svc.to_string())].into()),
                ..ObjectMeta::default()
            },
            address_type: "IPv4".into(),
            endpoints: vec![SliceEndpoint {
                addresses: vec!["10.0.0.1".into()],
                node_name: Some("n1".into()),
                target_ref: Some(ObjectReference {
                    kind: Some("Pod".into()),
                    name: Some(pod.into()),
                    namespace: Some(ns.into()),
                    ..ObjectReference::default()
                }),
                ..SliceEndpoint::default()
            }],
            ports: None,
        }))
    }

    fn k(ns: &str, n: &str) -> ObjKey {
        (ns.into(), n.into())
    }

    #[test]
    fn slices_join_services_and_changes_name_who_they_touch() {
        let mut c = Cluster::default();
        assert_eq!(
            c.apply(slice("a", "web-1", "web", "p1")),
            vec![k("a", "web")]
        );
        assert_eq!(c.slices_of(&k("a", "web")).count(), 1);
        // The same slice relabelled to another Service touches both.
        assert_eq!(
            c.apply(slice("a", "web-1", "api", "p1")),
            vec![k("a", "api"), k("a", "web")]
        );
        assert_eq!(c.slices_of(&k("a", "web")).count(), 0);

        // Pods and nodes touch the Services whose endpoints they back, and only on a change.
        let info = PodInfo {
            service_account: Some("sa".into()),
            ..PodInfo::default()
        };
        assert_eq!(
            c.apply(Item::Pod(k("a", "p1"), info.clone())),
            vec![k("a", "api")]
        );
        assert!(c.apply(Item::Pod(k("a", "p1"), info)).is_empty());
        assert!(c
            .apply(Item::Pod(k("a", "p2"), PodInfo::default()))
            .is_empty());
        let topo = Topology {
            region: Some("r".into()),
            ..Topology::default()
        };
        assert_eq!(c.apply(Item::Node("n1".into(), topo)), vec![k("a", "api")]);

        // A re-list of namespace `a` without the slice removes it and its pod index.
        c.replace(Kind::Slices, Some("a"), Vec::new());
        assert_eq!(c.slices_of(&k("a", "api")).count(), 0);
        assert!(c
            .apply(Item::Pod(k("a", "p1"), PodInfo::default()))
            .is_empty());
    }
}
