//! Sync status per sink (`/debug/syncz`, `mcp_adapter_sink_subscriptions`, `mcpctl status`)
//! with Istio's real istiod as one sink: "has every istiod got what the registry holds?"
//! answered by the source, since istiod says nothing about its config sources.
//!
//! One adapter-file serves a ServiceEntry to istiod (`configSources: xds://`), to a delta sink
//! that ACKs, and to a SotW sink that NACKs everything; a second adapter has no sink; a third
//! address answers nothing. `mcpctl status` over the three prints one row per sink, istiod's
//! SYNCED at the version served now and again after a change, the NACK with its reason, the
//! adapter without sinks, and the one it could not read (exit 1). The gauge counts the same.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use e2e::istiod::Istiod;
use e2e::kube::KubeApiServer;
use e2e::xds_sinks::{Flavour, SinkSpec, XdsSinks};
use e2e::{wait_for, workspace_bin, Adapter};

const WAIT: Duration = Duration::from_secs(60);
const REASON: &str = "rejected on purpose by the test";

fn write_entry(dir: &Path, ip: &str) {
    let yaml = format!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: orders, namespace: shop}}\nspec:\n  hosts: [orders.shop.example]\n  resolution: STATIC\n  ports: [{{number: 80, name: http, protocol: HTTP}}]\n  endpoints: [{{address: {ip}}}]\n"
    );
    // Written whole and renamed: the adapter never reads half a file.
    let tmp = dir.join(".orders.yaml.tmp");
    std::fs::write(&tmp, yaml).expect("write");
    std::fs::rename(&tmp, dir.join("orders.yaml")).expect("rename");
}

fn syncz(a: &Adapter) -> Value {
    let (status, body) = a.get("/debug/syncz");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("syncz JSON")
}

fn served_version(z: &Value) -> String {
    z["served"][0]["version"]
        .as_str()
        .expect("a served version")
        .to_string()
}

/// The sink whose node id is `node`.
fn sink<'a>(z: &'a Value, node: &str) -> Option<&'a Value> {
    z["sinks"]
        .as_array()?
        .iter()
        .find(|s| s["node"].as_str() == Some(node))
}

fn subscriptions(a: &Adapter, state: &str) -> f64 {
    a.metric_with(
        "mcp_adapter_sink_subscriptions",
        &format!("state=\"{state}\""),
    )
}

fn mcpctl_status(addrs: &[&str]) -> (bool, String, String) {
    let out = Command::new(workspace_bin("mcpctl"))
        .arg("status")
        .args(addrs)
        .args(["--timeout", "3s"])
        .output()
        .expect("mcpctl runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The table's row for `who` (a node id or "(no sink connected)") at adapter `addr`.
fn row<'a>(table: &'a str, addr: &str, who: &str) -> Option<&'a str> {
    table
        .lines()
        .find(|l| l.starts_with(addr) && l.contains(who))
}

#[test]
#[ignore = "needs istiod (PILOT_DISCOVERY) and the kube-apiserver (KUBE_BIN_DIR); the README's test command runs it"]
fn status_shows_istiod_synced_a_nacking_sink_with_its_reason_and_unreachable_adapters() {
    let kube = KubeApiServer::start();
    kube.namespace("istio-system");
    let dir = tempfile::tempdir().expect("tempdir");
    write_entry(dir.path(), "10.0.0.1");
    let path = dir.path().display().to_string();
    let a = Adapter::start("adapter-file", &["--path", &path]);
    a.wait_ready();
    let empty_dir = tempfile::tempdir().expect("tempdir");
    let lonely_path = empty_dir.path().display().to_string();
    let lonely = Adapter::start("adapter-file", &["--path", &lonely_path]);
    lonely.wait_ready();
    let istiod = Istiod::start(&[a.grpc], &kube.kubeconfig());
    let sinks = XdsSinks::start(
        a.grpc,
        &[
            SinkSpec {
                node: Some("nacker"),
                nack: Some(REASON),
                ..SinkSpec::acking(Flavour::Sotw)
            },
            SinkSpec {
                node: Some("delta-ok"),
                ..SinkSpec::acking(Flavour::Delta)
            },
        ],
    );

    // istiod is the sink that is neither of ours; it ACKs the version served now.
    let v1 = served_version(&syncz(&a));
    let istiod_node = wait_for(WAIT, "istiod synced at the served version", || {
        let z = syncz(&a);
        z["sinks"].as_array()?.iter().find_map(|s| {
            let node = s["node"].as_str()?;
            let t = &s["types"][0];
            (!["nacker", "delta-ok"].contains(&node)
                && t["state"] == "synced"
                && t["acked"]["version"] == v1.as_str())
            .then(|| node.to_string())
        })
    });
    wait_for(WAIT, "the NACK and the delta ACK recorded", || {
        let z = syncz(&a);
        let nacked = &sink(&z, "nacker")?["types"][0];
        let ok = &sink(&z, "delta-ok")?["types"][0];
        (nacked["state"] == "nacked" && ok["state"] == "synced").then_some(())
    });
    let z = syncz(&a);
    let nacked = &sink(&z, "nacker").expect("nacker")["types"][0];
    assert!(
        nacked["nack"]["detail"]
            .as_str()
            .is_some_and(|d| d.ends_with(REASON)),
        "{z}"
    );
    assert_eq!(nacked["nack"]["version"], v1.as_str(), "{z}");
    assert!(nacked["acked"].is_null(), "it never ACKed: {z}");
    assert_eq!(sink(&z, "nacker").expect("nacker")["protocol"], "xds");
    assert_eq!(sink(&z, "delta-ok").expect("delta")["protocol"], "delta");
    assert_eq!(
        subscriptions(&a, "synced"),
        2.0,
        "istiod and the delta sink"
    );
    assert_eq!(subscriptions(&a, "nacked"), 1.0);
    assert_eq!(subscriptions(&a, "pending"), 0.0);
    assert_eq!(subscriptions(&lonely, "synced"), 0.0);

    // The table across three addresses: one adapter with sinks, one without, one not there.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let nowhere = closed.local_addr().expect("addr").to_string();
    drop(closed);
    let (admin, lonely_admin) = (a.admin.to_string(), lonely.admin.to_string());
    let (ok, table, stderr) = mcpctl_status(&[&admin, &lonely_admin, &nowhere]);
    eprintln!("{table}");
    assert!(
        !ok,
        "one adapter could not be read: exit 1\n{table}{stderr}"
    );
    assert!(
        stderr.contains("1 of 3 adapters could not be read"),
        "{stderr}"
    );
    let short = |v: &str| v.chars().take(12).collect::<String>();
    let istiod_row = row(&table, &admin, &istiod_node).expect("istiod's row");
    assert!(
        istiod_row.contains("SYNCED") && istiod_row.contains(&short(&v1)),
        "{table}"
    );
    assert!(
        row(&table, &admin, "nacker").is_some_and(|r| r.contains("NACKED")),
        "{table}"
    );
    assert!(
        row(&table, &admin, "delta-ok")
            .is_some_and(|r| r.contains("SYNCED") && r.contains("delta")),
        "{table}"
    );
    assert!(
        table.contains(&format!("NACK: {admin} nacker")) && table.contains(REASON),
        "{table}"
    );
    assert!(
        row(&table, &lonely_admin, "(no sink connected)").is_some_and(|r| r.contains("NO SINK")),
        "{table}"
    );
    assert!(
        row(&table, &nowhere, "UNREACHABLE").is_some()
            && table.contains(&format!("error: admin port {nowhere}")),
        "{table}"
    );

    // A change: istiod acknowledges the new version, and the table says so.
    write_entry(dir.path(), "10.0.0.2");
    let v2 = wait_for(WAIT, "a new served version", || {
        let v = served_version(&syncz(&a));
        (v != v1).then_some(v)
    });
    wait_for(
        WAIT,
        "istiod SYNCED at the new version in mcpctl status",
        || {
            let (ok, table, _) = mcpctl_status(&[&admin]);
            let r = row(&table, &admin, &istiod_node)?;
            (ok && r.contains("SYNCED") && r.contains(&short(&v2))).then_some(())
        },
    );
    let z = syncz(&a);
    let nacked = &sink(&z, "nacker").expect("nacker")["types"][0];
    assert_eq!(
        nacked["nack"]["version"],
        v2.as_str(),
        "the new one rejected too: {z}"
    );

    // Sinks gone: their rows and their counts go with them.
    drop(sinks);
    wait_for(WAIT, "the test sinks left the board", || {
        let z = syncz(&a);
        (z["sinks"].as_array()?.len() == 1).then_some(())
    });
    assert_eq!(subscriptions(&a, "nacked"), 0.0);
    assert_eq!(subscriptions(&a, "synced"), 1.0, "istiod alone");
    assert!(
        !istiod.has_exited(),
        "istiod still running: {}",
        istiod.log_tail(20)
    );
    a.assert_no_registry_errors("sync status");
}
