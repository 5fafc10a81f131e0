//! Services and EndpointSlices reduced to what [`convert`](crate::convert) and
//! [`state`](crate::state) read, before they are kept.
//!
//! The API server sends every object with `metadata.managedFields` (server-side apply's record of
//! who set each field: a tree of JSON maps, often larger than the object itself), annotations
//! such as kubectl's `last-applied-configuration` (the whole object again, as a string), owner
//! references, the Service's selector and status, and per endpoint hints, host names and the
//! target's uid. None of it is read; kept for every object of a cluster it is most of the
//! adapter's memory. What stays:
//!
//! - Service: name, namespace, labels (ServiceEntry labels), the `exportTo` annotation, the
//!   creation timestamp (MCP `create_time`); of the spec the type, cluster IPs, external name,
//!   ports and `publishNotReadyAddresses`.
//! - EndpointSlice: name, namespace, the `kubernetes.io/service-name` label; the address type,
//!   the ports; per endpoint the addresses, the ready condition, zone, node name and the target's
//!   kind, namespace and name.

use k8s_openapi::api::core::v1::{ObjectReference, Service, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointSlice};
use kube::api::ObjectMeta;

use crate::convert::EXPORT_TO;
use crate::state::SERVICE_NAME_LABEL;

/// The parts of a Service the conversion reads.
pub fn service(s: Service) -> Service {
    let spec = s.spec.map(|spec| ServiceSpec {
        type_: spec.type_,
        cluster_ip: spec.cluster_ip,
        cluster_ips: spec.cluster_ips,
        external_name: spec.external_name,
        ports: spec.ports,
        publish_not_ready_addresses: spec.publish_not_ready_addresses,
        ..ServiceSpec::default()
    });
    Service {
        metadata: meta(s.metadata, true, |_| true, |k| k == EXPORT_TO),
        spec,
        status: None,
    }
}

/// The parts of an EndpointSlice the join and the conversion read.
pub fn slice(s: EndpointSlice) -> EndpointSlice {
    EndpointSlice {
        metadata: meta(s.metadata, false, |k| k == SERVICE_NAME_LABEL, |_| false),
        address_type: s.address_type,
        endpoints: s.endpoints.into_iter().map(endpoint).collect(),
        ports: s.ports,
    }
}

fn endpoint(e: Endpoint) -> Endpoint {
    Endpoint {
        addresses: e.addresses,
        conditions: e.conditions.map(|c| EndpointConditions {
            ready: c.ready,
            ..EndpointConditions::default()
        }),
        zone: e.zone,
        node_name: e.node_name,
        target_ref: e.target_ref.map(|r| ObjectReference {
            kind: r.kind,
            namespace: r.namespace,
            name: r.name,
            ..ObjectReference::default()
        }),
        ..Endpoint::default()
    }
}

/// Name and namespace, the labels and annotations `keep_label` and `keep_annotation` choose
/// (none left: `None`), and the creation timestamp when asked.
fn meta(
    m: ObjectMeta,
    created: bool,
    keep_label: impl Fn(&str) -> bool,
    keep_annotation: impl Fn(&str) -> bool,
) -> ObjectMeta {
    let filter = |map: Option<std::collections::BTreeMap<String, String>>,
                  keep: &dyn Fn(&str) -> bool| {
        map.map(|mut m| {
            m.retain(|k, _| keep(k));
            m
        })
        .filter(|m| !m.is_empty())
    };
    ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        labels: filter(m.labels, &keep_label),
        annotations: filter(m.annotations, &keep_annotation),
        creation_timestamp: if created { m.creation_timestamp } else { None },
        ..ObjectMeta::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::{convert_service, Settings};
    use crate::state::{Cluster, Item};
    use k8s_openapi::api::core::v1::{ServicePort, ServiceStatus};
    use k8s_openapi::api::discovery::v1::{EndpointHints, EndpointPort, ForZone};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        FieldsV1, ManagedFieldsEntry, OwnerReference, Time,
    };

    /// What a real API server sends: managed fields, kubectl's annotation, owner references.
    fn full_meta(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> ObjectMeta {
        let map = |kv: &[(&str, &str)]| {
            Some(
                kv.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        };
        ObjectMeta {
            name: Some("web".into()),
            namespace: Some("shop".into()),
            uid: Some("0b6c-uid".into()),
            resource_version: Some("4711".into()),
            generation: Some(3),
            creation_timestamp: Some(Time("2026-11-01T10:00:00Z".parse().expect("time"))),
            labels: map(labels),
            annotations: map(annotations),
            finalizers: Some(vec!["example.com/keep".into()]),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Service".into(),
                name: "web".into(),
                uid: "0b6c-uid".into(),
                ..OwnerReference::default()
            }]),
            managed_fields: Some(vec![ManagedFieldsEntry {
                manager: Some("kubectl".into()),
                operation: Some("Apply".into()),
                fields_v1: Some(FieldsV1(serde_json::json!({
                    "f:metadata": {"f:labels": {"f:app": {}}},
                    "f:spec": {"f:ports": {"k:{\"port\":80}": {"f:name": {}, "f:port": {}}}}
                }))),
                ..ManagedFieldsEntry::default()
            }]),
            ..ObjectMeta::default()
        }
    }

    fn full_service() -> Service {
        Service {
            metadata: full_meta(
                &[("app", "web"), ("tier", "front")],
                &[
                    (EXPORT_TO, "."),
                    (
                        "kubectl.kubernetes.io/last-applied-configuration",
                        "{\"apiVersion\":\"v1\",\"kind\":\"Service\"}",
                    ),
                ],
            ),
            spec: Some(ServiceSpec {
                cluster_ip: Some("10.96.0.10".into()),
                cluster_ips: Some(vec!["10.96.0.10".into()]),
                ports: Some(vec![ServicePort {
                    name: Some("http".into()),
                    port: 80,
                    ..ServicePort::default()
                }]),
                selector: Some([("app".to_string(), "web".to_string())].into()),
                session_affinity: Some("None".into()),
                ..ServiceSpec::default()
            }),
            status: Some(ServiceStatus::default()),
        }
    }

    fn full_slice() -> EndpointSlice {
        EndpointSlice {
            metadata: full_meta(
                &[
                    (SERVICE_NAME_LABEL, "web"),
                    ("endpointslice.kubernetes.io/managed-by", "controller"),
                ],
                &[("endpoints.kubernetes.io/last-change-trigger-time", "x")],
            ),
            address_type: "IPv4".into(),
            endpoints: vec![Endpoint {
                addresses: vec!["10.1.0.1".into()],
                conditions: Some(EndpointConditions {
                    ready: Some(true),
                    serving: Some(true),
                    terminating: Some(false),
                }),
                hints: Some(EndpointHints {
                    for_zones: Some(vec![ForZone { name: "z1".into() }]),
                    ..EndpointHints::default()
                }),
                hostname: Some("web-0".into()),
                node_name: Some("n1".into()),
                zone: Some("z1".into()),
                target_ref: Some(ObjectReference {
                    kind: Some("Pod".into()),
                    namespace: Some("shop".into()),
                    name: Some("web-0".into()),
                    uid: Some("pod-uid".into()),
                    resource_version: Some("99".into()),
                    ..ObjectReference::default()
                }),
                ..Endpoint::default()
            }],
            ports: Some(vec![EndpointPort {
                name: Some("http".into()),
                port: Some(8080),
                ..EndpointPort::default()
            }]),
        }
    }

    #[test]
    fn managed_fields_and_unread_fields_are_dropped() {
        let svc = service(full_service());
        assert!(svc.metadata.managed_fields.is_none());
        assert!(svc.metadata.owner_references.is_none() && svc.metadata.finalizers.is_none());
        assert!(svc.metadata.uid.is_none() && svc.metadata.resource_version.is_none());
        assert_eq!(
            svc.metadata.annotations,
            Some([(EXPORT_TO.to_string(), ".".to_string())].into())
        );
        assert_eq!(svc.metadata.labels.as_ref().map(|l| l.len()), Some(2));
        assert!(svc.metadata.creation_timestamp.is_some());
        assert!(svc.status.is_none());
        let spec = svc.spec.expect("spec");
        assert!(spec.selector.is_none() && spec.session_affinity.is_none());
        assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.10"));

        let s = slice(full_slice());
        assert!(s.metadata.managed_fields.is_none() && s.metadata.annotations.is_none());
        assert_eq!(
            s.metadata.labels,
            Some([(SERVICE_NAME_LABEL.to_string(), "web".to_string())].into())
        );
        let e = &s.endpoints[0];
        assert!(e.hints.is_none() && e.hostname.is_none());
        let r = e.target_ref.as_ref().expect("target");
        assert!(r.uid.is_none() && r.resource_version.is_none());
        assert_eq!(r.name.as_deref(), Some("web-0"));
        assert_eq!(
            e.conditions.as_ref().and_then(|c| c.serving),
            None,
            "only ready is read"
        );

        // Well under half the size, serialized the way the API server sent it.
        let len = |v: &EndpointSlice| serde_json::to_vec(v).expect("json").len();
        assert!(
            len(&s) * 2 < len(&full_slice()),
            "{} of {}",
            len(&s),
            len(&full_slice())
        );
    }

    /// The reduced objects convert exactly as the full ones do.
    #[test]
    fn the_conversion_is_unchanged() {
        let settings = Settings {
            cluster_domain: "cluster.local".into(),
            cluster_ip: true,
            headless: crate::config::Headless::None,
            network: None,
            trust_domain: "cluster.local".into(),
        };
        let convert = |svc: Service, sl: EndpointSlice| {
            let mut c = Cluster::default();
            c.apply(Item::Service(Box::new(svc)));
            c.apply(Item::Slice(Box::new(sl)));
            let key = ("shop".to_string(), "web".to_string());
            let out = convert_service(&c, &key, &settings);
            (format!("{:?}", out.service), out.problems)
        };
        let full = convert(full_service(), full_slice());
        assert!(full.0.contains("10.1.0.1"), "{}", full.0);
        assert_eq!(convert(service(full_service()), slice(full_slice())), full);
    }
}
