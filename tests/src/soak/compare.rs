//! What istiod and Envoy hold, as [`Truth`]s (host -> `ip:port` of each endpoint), and how a
//! view differs from the registries' truth.

use std::collections::BTreeSet;

use serde_json::Value;

use super::model::{Truth, PORT};
use crate::envoy::{host_address, Envoy};
use crate::istiod::{configz_entries, Istiod};

/// istiod's and Envoy's views of the soak's services.
#[derive(Debug, Default)]
pub struct Views {
    /// The ServiceEntries istiod holds (`/debug/configz`), with their endpoints.
    pub configz: Truth,
    /// istiod's endpoint index (`/debug/endpointShardz`), every shard of a host together.
    pub shardz: Truth,
    /// Envoy's EDS endpoints of each `outbound|PORT||host` cluster.
    pub envoy: Truth,
}

/// A debug endpoint of istiod as JSON; `Err` while istiod does not answer (it may be starting).
fn istiod_json(istiod: &Istiod, what: &str) -> Result<Value, String> {
    let (status, body) = istiod
        .try_get(&format!("/debug/{what}"))
        .ok_or_else(|| format!("istiod /debug/{what} unreachable"))?;
    if status != 200 {
        return Err(format!("istiod /debug/{what}: {status}"));
    }
    serde_json::from_str(&body).map_err(|e| format!("istiod /debug/{what}: {e}"))
}

/// istiod's and Envoy's views, limited to the ServiceEntries of `namespaces`.
pub fn views(istiod: &Istiod, envoy: &Envoy, namespaces: &[String]) -> Result<Views, String> {
    let ours = |ns: &str| namespaces.iter().any(|n| n == ns);
    let mut v = Views::default();

    let configz = istiod_json(istiod, "configz")?;
    for se in configz_entries(&configz) {
        if !ours(se["metadata"]["namespace"].as_str().unwrap_or("")) {
            continue;
        }
        let spec = &se["spec"];
        let port = spec["ports"][0]["number"].as_u64().unwrap_or(0);
        let port_name = spec["ports"][0]["name"].as_str().unwrap_or("");
        let eps: BTreeSet<String> = spec["endpoints"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                let p = e["ports"][port_name].as_u64().unwrap_or(port);
                format!("{}:{p}", e["address"].as_str().unwrap_or("?"))
            })
            .collect();
        for h in spec["hosts"].as_array().into_iter().flatten() {
            v.configz
                .entry(h.as_str().unwrap_or("?").to_string())
                .or_default()
                .extend(eps.iter().cloned());
        }
    }

    let shardz = istiod_json(istiod, "endpointShardz")?;
    for (host, by_ns) in shardz.as_object().into_iter().flatten() {
        for (ns, entry) in by_ns.as_object().into_iter().flatten() {
            if !ours(ns) {
                continue;
            }
            let eps = v.shardz.entry(host.clone()).or_default();
            for (_, list) in entry["Shards"].as_object().into_iter().flatten() {
                for e in list.as_array().into_iter().flatten() {
                    let port = &e["EndpointPort"];
                    for a in e["Addresses"].as_array().into_iter().flatten() {
                        eps.insert(format!("{}:{port}", a.as_str().unwrap_or("?")));
                    }
                }
            }
        }
    }

    let (status, body) = crate::http11_get(envoy.admin, "/config_dump?include_eds")
        .map_err(|e| format!("envoy config_dump: {e}"))?;
    if status != 200 {
        return Err(format!("envoy config_dump: {status}"));
    }
    let dump: Value = serde_json::from_str(&body).map_err(|e| format!("config_dump: {e}"))?;
    let prefix = format!("outbound|{PORT}||");
    for c in dump["configs"].as_array().into_iter().flatten() {
        if !c["@type"]
            .as_str()
            .is_some_and(|t| t.ends_with("EndpointsConfigDump"))
        {
            continue;
        }
        for e in c["dynamic_endpoint_configs"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let cfg = &e["endpoint_config"];
            let Some(host) = cfg["cluster_name"]
                .as_str()
                .and_then(|n| n.strip_prefix(&prefix))
            else {
                continue;
            };
            let eps = v.envoy.entry(host.to_string()).or_default();
            for locality in cfg["endpoints"].as_array().into_iter().flatten() {
                for lb in locality["lb_endpoints"].as_array().into_iter().flatten() {
                    eps.insert(host_address(&lb["endpoint"]));
                }
            }
        }
    }
    Ok(v)
}

/// How `seen` differs from `truth`, one line per host (empty: equal). With `exact_hosts`
/// every host must be there, with no other (a ServiceEntry per service); without, a host with
/// no endpoint and a missing one are alike (istiod's index and Envoy keep no entry, or an
/// empty one, for a service without endpoints, and a service with no port has no cluster).
pub fn diff(truth: &Truth, seen: &Truth, exact_hosts: bool) -> Vec<String> {
    let empty = BTreeSet::new();
    let hosts: BTreeSet<&String> = truth.keys().chain(seen.keys()).collect();
    let mut out = Vec::new();
    for h in hosts {
        match (truth.get(h), seen.get(h)) {
            (Some(_), None) if exact_hosts => out.push(format!("{h}: missing service")),
            (None, Some(s)) if exact_hosts => {
                out.push(format!("{h}: stale service (endpoints {s:?})"))
            }
            (t, s) => {
                let (t, s) = (t.unwrap_or(&empty), s.unwrap_or(&empty));
                if t != s {
                    let lost: Vec<&String> = t.difference(s).collect();
                    let phantom: Vec<&String> = s.difference(t).collect();
                    out.push(format!("{h}: lost {lost:?}, phantom {phantom:?}"));
                }
            }
        }
    }
    out
}

/// Every difference of the three views from `truth`, each line prefixed with the view's name.
pub fn diff_all(truth: &Truth, v: &Views) -> Vec<String> {
    let mut out = Vec::new();
    for (name, seen, exact) in [
        ("istiod configz", &v.configz, true),
        ("istiod endpointShardz", &v.shardz, false),
        ("envoy eds", &v.envoy, false),
    ] {
        out.extend(
            diff(truth, seen, exact)
                .into_iter()
                .map(|l| format!("{name}: {l}")),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(entries: &[(&str, &[&str])]) -> Truth {
        entries
            .iter()
            .map(|(h, eps)| (h.to_string(), eps.iter().map(|e| e.to_string()).collect()))
            .collect()
    }

    #[test]
    fn lost_phantom_and_stale_are_told_apart() {
        let truth = t(&[("a", &["1:1", "2:1"]), ("b", &[])]);
        assert!(diff(&truth, &truth, true).is_empty());
        let seen = t(&[("a", &["1:1", "3:1"]), ("c", &["4:1"])]);
        let d = diff(&truth, &seen, true);
        assert_eq!(d.len(), 3, "{d:?}");
        assert!(d[0].contains("lost [\"2:1\"], phantom [\"3:1\"]"), "{d:?}");
        assert!(d[1].contains("b: missing service"), "{d:?}");
        assert!(d[2].contains("c: stale service"), "{d:?}");
        // Without exact hosts an empty service may be missing, but not a non-empty one.
        let d = diff(&truth, &t(&[("a", &["1:1", "2:1"])]), false);
        assert!(d.is_empty(), "{d:?}");
        let d = diff(
            &truth,
            &t(&[("a", &["1:1", "2:1"]), ("c", &["4:1"])]),
            false,
        );
        assert_eq!(d.len(), 1, "{d:?}");
    }
}
