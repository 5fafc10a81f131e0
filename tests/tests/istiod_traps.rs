//! The README's traps for pointing Istio at adapters, each shown with Istio's real, unmodified
//! istiod (`pilot-discovery`):
//! - trap 1: once `configSources` is set, istiod reads the ServiceEntry objects in the API
//!   server only when `k8s://` is one of them;
//! - trap 2: istiod exits when a source is unreachable at its start, and is not ready while a
//!   source it reached has not answered;
//! - trap 6: a resource labelled `istio.io/rev` with another revision than istiod's is dropped
//!   (an unlabelled one, and one labelled with istiod's own revision, are held).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

use e2e::istiod::{
    apply_istio_crds, configz_entries, configz_service_entries, Istiod, IstiodConfig,
};
use e2e::kube::KubeApiServer;
use e2e::stall_proxy::StallProxy;
use e2e::{free_addr, ns_name, service_entry_yaml, wait_for, wait_served, Adapter};

/// An API server with istiod's namespace, as every trap's istiod reads it.
fn api_server() -> KubeApiServer {
    let kube = KubeApiServer::start();
    kube.namespace("istio-system");
    kube
}

/// A directory holding one ServiceEntry file, `<name>.yaml`, with one endpoint `ip`.
fn one_entry(name: &str, ip: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join(format!("{name}.yaml")),
        service_entry_yaml(name, ip),
    )
    .expect("write");
    dir
}

/// An adapter-file serving the ServiceEntry files in `dir` (polled every 100 ms).
fn adapter_file(dir: &Path) -> Adapter {
    let a = Adapter::start(
        "adapter-file",
        &[
            "--path",
            &dir.display().to_string(),
            "--poll-interval",
            "100ms",
        ],
    );
    a.wait_ready();
    a
}

/// `namespace/name` of every ServiceEntry istiod holds, sorted.
fn configz_names(istiod: &Istiod) -> Vec<String> {
    configz_service_entries(&istiod.debug("configz"))
}

/// Waits until istiod holds exactly the ServiceEntries `want` (sorted `namespace/name`);
/// panics with what it holds after 60 s.
fn wait_configz(istiod: &Istiod, want: &[&str], what: &str) {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let held = configz_names(istiod);
        if held == want {
            return;
        }
        assert!(
            Instant::now() < end,
            "istiod did not reach {what:?} within 60 s: it holds {held:?}, not {want:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[ignore = "needs pilot-discovery and kube-apiserver: tests/go-peers/build.sh target"]
fn trap_1_istiod_reads_service_entry_objects_only_with_a_k8s_source() {
    let kube = api_server();
    kube.namespace("cluster");
    apply_istio_crds(&kube);
    // A ServiceEntry object in the API server, as a CRD writer or `--output kube` leaves it.
    kube.apply(
        "/apis/networking.istio.io/v1/namespaces/cluster/serviceentries",
        &json!({
            "apiVersion": "networking.istio.io/v1",
            "kind": "ServiceEntry",
            "metadata": {"name": "in-cluster", "namespace": "cluster"},
            "spec": {
                "hosts": ["in-cluster.example.com"],
                "resolution": "STATIC",
                "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
                "endpoints": [{"address": "10.0.1.1"}]
            }
        }),
    );
    let files = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        files.path().join("from-adapter.yaml"),
        service_entry_yaml("from-adapter", "10.0.0.1"),
    )
    .expect("write");
    let a = adapter_file(files.path());

    // Only the adapter among the sources: the object in the cluster is not read.
    let xds_only = Istiod::start(&[a.grpc], &kube.kubeconfig());
    wait_configz(&xds_only, &["ns/from-adapter"], "the adapter's entry");
    // Not merely early: a later change from the adapter arrives, and the object still does not
    // (istiod is ready only once every config store it has synced, so it had its chance).
    std::fs::write(
        files.path().join("later.yaml"),
        service_entry_yaml("later", "10.0.0.2"),
    )
    .expect("write");
    wait_configz(
        &xds_only,
        &["ns/from-adapter", "ns/later"],
        "the adapter's later entry, and nothing from the cluster",
    );
    assert!(
        !xds_only.log().contains("Started Kubernetes configSource"),
        "istiod without k8s:// started a Kubernetes config source"
    );
    drop(xds_only);

    // `k8s://` listed too: the same object is read, beside the adapter's.
    let with_k8s = Istiod::start_with(
        &[a.grpc],
        &kube.kubeconfig(),
        &IstiodConfig {
            k8s_first: true,
            ..IstiodConfig::default()
        },
    );
    wait_configz(
        &with_k8s,
        &["cluster/in-cluster", "ns/from-adapter", "ns/later"],
        "the object in the cluster beside the adapter's entries",
    );
    assert!(
        with_k8s
            .log()
            .contains("Started Kubernetes configSource k8s://"),
        "istiod with k8s:// did not log its Kubernetes config source:\n{}",
        with_k8s.log_tail(40)
    );
}

#[test]
#[ignore = "needs pilot-discovery and kube-apiserver: tests/go-peers/build.sh target"]
fn trap_2_istiod_exits_when_a_source_is_down_at_its_start() {
    let kube = api_server();
    let files = one_entry("web", "10.0.0.1");
    let up = adapter_file(files.path());
    // Nobody listens here yet.
    let down = free_addr();

    let istiod = Istiod::spawn(
        &[up.grpc, down],
        &kube.kubeconfig(),
        &IstiodConfig::default(),
    );
    wait_for(Duration::from_secs(120), "istiod to exit", || {
        istiod.has_exited().then_some(())
    });
    let log = istiod.log();
    // The log names the source it could not reach, in the error it exits with.
    let line = log
        .lines()
        .find(|l| l.contains("MCP: failed running") && l.contains(&down.to_string()))
        .unwrap_or_else(|| {
            panic!(
                "istiod exited without an error naming {down}:\n{}",
                istiod.log_tail(40)
            )
        });
    eprintln!("istiod exited; its line naming the source: {line}");
    assert!(
        istiod.try_get("/ready").is_none_or(|(s, _)| s != 200),
        "an exited istiod answered /ready 200"
    );
    drop(istiod);

    // The same sources with an adapter listening at the address: istiod starts and is ready, so
    // the exit above was that source's doing.
    let files2 = one_entry("api", "10.0.0.2");
    let second = Adapter::start_on(
        "adapter-file",
        down,
        &[
            "--path",
            &files2.path().display().to_string(),
            "--poll-interval",
            "100ms",
        ],
        &[],
    );
    second.wait_ready();
    let istiod = Istiod::start(&[up.grpc, down], &kube.kubeconfig());
    wait_configz(
        &istiod,
        &["ns/api", "ns/web"],
        "the entries of both sources",
    );
}

#[test]
#[ignore = "needs pilot-discovery and kube-apiserver: tests/go-peers/build.sh target"]
fn trap_2_istiod_is_not_ready_while_a_source_is_silent_and_then_exits() {
    let kube = api_server();
    let files = one_entry("web", "10.0.0.1");
    let answering = adapter_file(files.path());
    let silent = adapter_file(files.path());
    // The second source accepts istiod's connection and then says nothing (not even gRPC's
    // handshake), as a peer behind a partition or a stuck process does.
    let proxy = StallProxy::start(silent.grpc);
    proxy.stall();

    let istiod = Istiod::spawn(
        &[answering.grpc, proxy.addr],
        &kube.kubeconfig(),
        &IstiodConfig::default(),
    );
    // istiod got everything from the source that answers: it acknowledged its ServiceEntries...
    let end = Instant::now() + Duration::from_secs(60);
    while answering.metric_with("mcp_adapter_acks_total", "type=\"serviceentry\"") < 1.0 {
        assert!(
            Instant::now() < end,
            "no ServiceEntry ACK from istiod on the answering source; istiod:\n{}",
            istiod.log_tail(60)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // ... and is not ready while the other says nothing.
    assert!(
        istiod.try_get("/ready").is_none_or(|(s, _)| s != 200),
        "istiod ready while its second source had not answered"
    );
    // Then it gives up on that source (gRPC's 20 s connect timeout) and exits, naming it.
    wait_for(Duration::from_secs(120), "istiod to exit", || {
        istiod.has_exited().then_some(())
    });
    let log = istiod.log();
    let line = log
        .lines()
        .find(|l| l.contains("MCP: failed running") && l.contains(&proxy.addr.to_string()))
        .unwrap_or_else(|| {
            panic!(
                "istiod exited without an error naming {}:\n{}",
                proxy.addr,
                istiod.log_tail(40)
            )
        });
    eprintln!("istiod exited; its line naming the silent source: {line}");
    assert!(
        !log.contains("marking server ready"),
        "istiod was ready at some point:\n{}",
        istiod.log_tail(40)
    );
}

/// A ServiceEntry file for `name` with `labels` (a YAML flow mapping, e.g. `{a: b}`).
fn labelled_service_entry(name: &str, ip: &str, labels: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: ns, labels: {labels}}}\nspec:\n  hosts: [{name}.example.com]\n  resolution: STATIC\n  ports: [{{number: 80, name: http, protocol: HTTP}}]\n  endpoints: [{{address: {ip}}}]\n"
    )
}

#[test]
#[ignore = "needs pilot-discovery and kube-apiserver: tests/go-peers/build.sh target"]
fn trap_6_istiod_drops_resources_of_another_revision() {
    let kube = api_server();
    let files = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        files.path().join("plain.yaml"),
        labelled_service_entry("plain", "10.0.0.1", "{team: a}"),
    )
    .expect("write");
    std::fs::write(
        files.path().join("rev-default.yaml"),
        labelled_service_entry("rev-default", "10.0.0.2", "{istio.io/rev: default}"),
    )
    .expect("write");
    std::fs::write(
        files.path().join("rev-other.yaml"),
        labelled_service_entry("rev-other", "10.0.0.3", "{istio.io/rev: other}"),
    )
    .expect("write");
    let a = adapter_file(files.path());
    // The adapter serves all three, labels as written.
    let served = wait_served(
        Duration::from_secs(30),
        "three entries",
        &a.xds_url(),
        |i| i.len() == 3,
    );
    let other = served
        .iter()
        .find(|i| ns_name(i) == "ns/rev-other")
        .unwrap_or_else(|| panic!("rev-other not served: {served:?}"));
    assert_eq!(
        other["metadata"]["labels"]["istio.io/rev"], "other",
        "{other}"
    );

    // istiod of revision `default` (Istiod's REVISION): the other revision's entry is dropped.
    // The three come in one response from one source, so the two held show that the response
    // was read whole.
    let istiod = Istiod::start(&[a.grpc], &kube.kubeconfig());
    wait_configz(
        &istiod,
        &["ns/plain", "ns/rev-default"],
        "the unlabelled entry and the one of istiod's revision, without the other revision's",
    );
    let configz = istiod.debug("configz");
    let labels: Vec<String> = configz_entries(&configz)
        .map(|c| format!("{} {}", ns_name(c), c["metadata"]["labels"]))
        .collect();
    eprintln!("istiod (revision default) holds: {labels:?}");
}
