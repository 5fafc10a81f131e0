//! Consul's catalog answers the watch reads to find what changed: the services list
//! (`/v1/catalog/services`), the nodes (`/v1/catalog/nodes`), the unhealthy checks
//! (`/v1/health/state/any`) and a node's services (`/v1/catalog/node-services/:node`). Each body
//! goes through the decode of each; every service name listed is then converted and translated
//! with one healthy instance, as the watch would once it fetched it.
#![no_main]

use std::collections::BTreeMap;

use adapter_consul::client::{decode, CheckState, NodeServices, NodeState, NODE_SERVICES};
use adapter_consul::convert::{convert, ConvertSettings, HealthEntry, Instance, Node};
use adapter_consul::ConsulRegistry;
use libfuzzer_sys::fuzz_target;
use mcp_bridge_fuzz::registries::serve;

fn one_instance(name: &str, tags: &[String]) -> HealthEntry {
    HealthEntry {
        node: Node {
            node: "node-1".into(),
            address: "10.0.0.1".into(),
            datacenter: "dc1".into(),
        },
        service: Instance {
            id: format!("{name}-1"),
            service: name.to_string(),
            tags: Some(tags.to_vec()),
            address: String::new(),
            meta: None,
            port: 8080,
            weights: None,
            kind: None,
            create_index: Some(1),
        },
        checks: Vec::new(),
    }
}

fuzz_target!(|data: &[u8]| {
    let settings = ConvertSettings {
        include_warning: false,
        tags: Vec::new(),
        default_protocol: None,
        host_datacenter: false,
    };
    if let Ok(services) = decode::<BTreeMap<String, Vec<String>>>("/v1/catalog/services", data) {
        for (name, tags) in services.iter().take(32) {
            let c = convert(name, &[one_instance(name, tags)], &settings);
            serve::<ConsulRegistry>(c.service);
        }
    }
    let _ = decode::<Vec<NodeState>>("/v1/catalog/nodes", data);
    let _ = decode::<Vec<CheckState>>("/v1/health/state/any", data);
    if let Ok(ns) = decode::<NodeServices>(NODE_SERVICES, data) {
        let _ = ns.names();
    }
});
