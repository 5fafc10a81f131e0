//! Helpers shared by the registry decoders' targets: the translate settings each adapter runs
//! with by default, and the checks every converted service goes through before it is served.

use mcp_core::translate::{translate, TranslateConfig, DEFAULT_MAX_LABELS};
use mcp_core::{OnEmpty, Registry, Service};

/// What `mcp_runtime::start` builds for registry `R` when no flag is given: its namespace, host
/// suffix and virtual IP range, `--on-empty keep`, the default label cap and naming.
pub fn default_config<R: Registry>() -> TranslateConfig {
    TranslateConfig {
        namespace: R::DEFAULT_NAMESPACE.to_string(),
        host_suffix: R::DEFAULT_HOST_SUFFIX.to_string(),
        export_to: Vec::new(),
        registry: R::NAME.to_string(),
        source: R::NAME.to_string(),
        on_empty: OnEmpty::Keep,
        vip_cidr: R::DEFAULT_VIP_CIDR,
        max_labels: DEFAULT_MAX_LABELS,
        naming: Default::default(),
    }
}

/// Translates each service on its own, as the runtime does, and checks what would be served.
///
/// Invariants: a converted service never holds an endpoint without an address (the adapters
/// skip such instances and say so); a service that fails validation comes back as `Invalid`
/// naming at least one reason, and never stops the others from being translated.
pub fn serve<R: Registry>(services: impl IntoIterator<Item = Service>) {
    let cfg = default_config::<R>();
    for s in services {
        check_model(&s);
        match translate(s, &cfg) {
            Ok(t) => {
                assert!(
                    t.endpoints.iter().all(|e| !e.address.is_empty()),
                    "{}: translated endpoint without an address",
                    t.name
                );
                crate::check_served(&t);
            }
            Err(invalid) => assert!(
                !invalid.errors.is_empty(),
                "{}: invalid without a reason",
                invalid.origin
            ),
        }
    }
}

/// The invariants of a converted service, before translation.
pub fn check_model(s: &Service) {
    for e in &s.endpoints {
        assert!(
            !e.address.trim().is_empty(),
            "{}: endpoint without an address",
            s.origin
        );
    }
}

/// Splits `data` at each NUL byte: the multi-part inputs' separator (none of the parts is
/// binary: names, URLs and JSON, which never holds a raw NUL).
pub fn parts(data: &[u8]) -> Vec<&[u8]> {
    data.split(|b| *b == 0).collect()
}

/// The invariants of Eureka's local copy: no app without an instance (an app whose last
/// instance went is removed, not served empty), and the count is the apps' instances.
pub fn check_local(local: &adapter_eureka::state::LocalRegistry) {
    let mut total = 0;
    for name in local.app_names() {
        let n = local.app(name).map_or(0, |i| i.len());
        assert!(n > 0, "eureka app {name:?} kept with no instance");
        total += n;
    }
    assert_eq!(total, local.instance_count());
}

/// Nacos: names every service of `ids` as the watch does, checks that no two share a name (one
/// host would serve another service's endpoints), then converts and translates `info` as each.
pub fn nacos_serve(
    ids: &[adapter_nacos::convert::ServiceId],
    info: impl Fn(&adapter_nacos::convert::ServiceId) -> adapter_nacos::dto::ServiceInfo,
) {
    use adapter_nacos::names::Names;
    let names = Names::assign(ids);
    let mut seen = std::collections::BTreeMap::new();
    for id in ids {
        let name = names.get(id).unwrap_or_else(|| panic!("{id} has no name"));
        if let Some(other) = seen.insert(name.to_string(), id) {
            assert_eq!(other, id, "{other} and {id} both named {name}");
        }
    }
    for id in ids {
        if let Some(name) = names.get(id) {
            let c = adapter_nacos::convert::convert_service(id, name, &info(id));
            serve::<adapter_nacos::NacosRegistry>(c.service);
        }
    }
}

/// One healthy instance of a service, for the targets that read names only.
pub fn nacos_one_instance() -> adapter_nacos::dto::ServiceInfo {
    adapter_nacos::dto::ServiceInfo {
        name: None,
        group_name: None,
        hosts: vec![Ok(adapter_nacos::dto::Instance {
            ip: "10.0.0.1".into(),
            port: 8080,
            weight: 1.0,
            healthy: true,
            enabled: true,
            ..Default::default()
        })],
    }
}
