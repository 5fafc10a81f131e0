//! Consul's `/v1/health/service/:name` answer, through the adapter's decode, conversion and the
//! core's translation: with the default settings, and with every option that changes the
//! conversion's path (warning instances served, datacenter hosts, a default protocol, a tag
//! filter).
#![no_main]

use adapter_consul::client::{decode, HEALTH};
use adapter_consul::convert::{convert, ConvertSettings, HealthEntry};
use adapter_consul::ConsulRegistry;
use libfuzzer_sys::fuzz_target;
use mcp_bridge_fuzz::registries::serve;

fuzz_target!(|data: &[u8]| {
    let Ok(entries) = decode::<Vec<HealthEntry>>(HEALTH, data) else {
        return;
    };
    // The name the watch asked for: the entries' own, as the catalog lists it.
    let name = entries
        .first()
        .map_or("web", |e| e.service.service.as_str())
        .to_string();
    let defaults = ConvertSettings {
        include_warning: false,
        tags: Vec::new(),
        default_protocol: None,
        host_datacenter: false,
    };
    let options = ConvertSettings {
        include_warning: true,
        tags: vec!["v1".to_string()],
        default_protocol: mcp_core::translate::naming::canonical_protocol("grpc"),
        host_datacenter: true,
    };
    for s in [defaults, options] {
        let c = convert(&name, &entries, &s);
        serve::<ConsulRegistry>(c.service);
    }
});
