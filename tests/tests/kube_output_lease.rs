//! The Kubernetes output's Lease against a real kube-apiserver: a leader whose way to the API
//! server stops answering (a partition: connections open, nothing comes back) stops writing by
//! its renew deadline, before the follower can take the Lease over, so that after the takeover
//! only the new leader's writes reach the API server. Who wrote what, and when, is read from the
//! API server's own audit log (each replica has its own user).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

use e2e::istiod::apply_istio_crds;
use e2e::kube::{audit_args, audited, Audited, KubeApiServer, TokenUser};
use e2e::kube_output::{endpoints, leads_in_step, output, start_file_adapter, write_entry};
use e2e::mesh::owned_service_entries;
use e2e::stall_proxy::StallProxy;
use e2e::wait_for;

const WAIT: Duration = Duration::from_secs(60);
/// The output's renew deadline (`lease::RENEW_DEADLINE`): a leader that could not renew for
/// this long must have stopped writing.
const RENEW_DEADLINE: Duration = Duration::from_secs(10);

/// The object `ns/name` of source `file` has the one endpoint `ip`.
fn holds(kube: &KubeApiServer, name: &str, ip: &str) -> bool {
    owned_service_entries(kube, "file")
        .get(&format!("ns/{name}"))
        .is_some_and(|o| endpoints(o) == [ip])
}

/// The ServiceEntry writes the API server completed, in the order it received them.
fn audited_writes(log: &Path) -> Vec<Audited> {
    audited(log, "serviceentries")
        .into_iter()
        .filter(|w| ["create", "patch", "update", "delete"].contains(&w.verb.as_str()))
        .collect()
}

#[test]
#[ignore = "needs kube-apiserver (tests/kube-apiserver/build.sh)"]
fn a_partitioned_leader_stops_writing_before_the_follower_takes_over() {
    // The audit log: metadata of every ServiceEntry and Lease request, nothing else.
    let audit = tempfile::tempdir().expect("tempdir");
    let (audit_args, log) = audit_args(
        audit.path(),
        &[
            ("networking.istio.io", "serviceentries"),
            ("coordination.k8s.io", "leases"),
        ],
    );
    // Each replica its own user, so the audit log tells their writes apart; both in
    // system:masters (the API server authorizes with RBAC, and this test is not about roles).
    let users: Vec<TokenUser> = ["a", "b"]
        .iter()
        .map(|r| TokenUser {
            groups: vec!["system:masters".into()],
            ..TokenUser::new(&format!("token-replica-{r}"), &format!("replica-{r}"))
        })
        .collect();
    let kube = KubeApiServer::start_with(
        &users,
        &audit_args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    kube.namespace("ns");
    apply_istio_crds(&kube);

    // Replica a reaches the API server through a proxy that can stall; b directly.
    let proxy = StallProxy::start(kube.addr);
    let kubeconfig_a = audit.path().join("kubeconfig-a");
    std::fs::write(
        &kubeconfig_a,
        json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "test", "cluster": {
                "server": format!("https://{}", proxy.addr),
                "certificate-authority": kube.ca().display().to_string(),
            }}],
            "users": [{"name": "test", "user": {"token": "token-replica-a"}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
            "current-context": "test",
        })
        .to_string(),
    )
    .expect("write a's kubeconfig");
    let kubeconfig_b = kube.kubeconfig_for("token-replica-b");

    let dir = tempfile::tempdir().expect("tempdir");
    write_entry(dir.path(), "orders", "10.0.0.2");
    write_entry(dir.path(), "pay", "10.0.0.3");
    // The same flags but the identity and the kubeconfig: one adapter, two replicas.
    let start = |identity: &str, kubeconfig: &Path| {
        start_file_adapter(
            dir.path(),
            kubeconfig,
            "both",
            &["--output-identity", identity],
        )
    };
    let a = start("replica-a", &kubeconfig_a);
    a.wait_ready();
    wait_for(WAIT, "replica a leads and writes orders and pay", || {
        (owned_service_entries(&kube, "file").len() == 2 && leads_in_step(&a)).then_some(())
    });
    let b = start("replica-b", &kubeconfig_b);
    b.wait_ready();
    b.wait_admin(WAIT, "replica b follows", "/readyz", |_, body| {
        body.contains("kube output: following")
    });

    // a's way to the API server stops answering. Its last renewal started before this, so by
    // RENEW_DEADLINE from now it must not write any more; b may take over only when the Lease
    // has not changed for its duration (15 s), later.
    proxy.stall();
    let stalled = Instant::now();
    std::thread::sleep(RENEW_DEADLINE + Duration::from_secs(2));
    // By then a says it no longer leads (its admin port is not behind the proxy): the Lease's
    // metric and the writer's status both.
    let status = output(&a);
    eprintln!("a after the renew deadline: {status}");
    assert_eq!(
        a.metric("mcp_adapter_kube_output_leader"),
        0.0,
        "a still leads {:?} after the stall: {status}\n{}",
        stalled.elapsed(),
        a.log_tail()
    );
    assert_eq!(status["leader"], false, "{status}\n{}", a.log_tail());
    // Nor did b take over yet: the Lease has not been unchanged for its duration.
    assert_eq!(b.metric("mcp_adapter_kube_output_leader"), 0.0);
    // Both replicas see this change; only a leader may write it. It comes after a's deadline
    // on purpose: a write a sends while it still leads (before the deadline) is held by the
    // partition like any packet and may land after the takeover; keeping those out needs the
    // writer to give up its requests in flight, which the Lease alone cannot do.
    write_entry(dir.path(), "orders", "10.0.0.22");
    wait_for(
        WAIT,
        "replica b takes over and writes orders' change",
        || (output(&b)["leader"] == true && holds(&kube, "orders", "10.0.0.22")).then_some(()),
    );
    eprintln!("b took over {:?} after the stall", stalled.elapsed());

    // a's network heals: whatever it still held back arrives now. The audit log is read only
    // once a has been answered again and says it follows: a write it held back is in the log
    // by then, not still on its way.
    proxy.resume();
    a.wait_admin(WAIT, "replica a follows", "/readyz", |_, body| {
        body.contains("kube output: following")
    });
    // A later change, written by b: the audit log covers the whole window after the takeover.
    write_entry(dir.path(), "pay", "10.0.0.33");
    wait_for(WAIT, "replica b writes pay's change", || {
        holds(&kube, "pay", "10.0.0.33").then_some(())
    });
    let writes = wait_for(WAIT, "b's write of pay in the audit log", || {
        let writes = audited_writes(&log);
        writes
            .iter()
            .any(|w| w.user == "replica-b" && w.name == "pay")
            .then_some(writes)
    });
    for w in &writes {
        eprintln!("{} {} {} {}", w.received, w.user, w.verb, w.name);
    }
    assert!(
        writes.iter().any(|w| w.user == "replica-a"),
        "the audit log shows no write by a at all: {writes:?}"
    );
    let takeover = writes
        .iter()
        .find(|w| w.user == "replica-b")
        .map(|w| w.received.clone())
        .expect("b wrote");
    let late: Vec<&Audited> = writes
        .iter()
        .filter(|w| w.user == "replica-a" && w.received >= takeover)
        .collect();
    assert!(
        late.is_empty(),
        "a's writes reached the API server after b's first write ({takeover}): {late:?}\n{}",
        a.log_tail()
    );
    // a still follows.
    assert_eq!(output(&a)["leader"], false);
    assert_eq!(a.metric("mcp_adapter_kube_output_leader"), 0.0);
    assert_eq!(output(&b)["leader"], true);
    drop(proxy);
}
