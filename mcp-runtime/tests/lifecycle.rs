//! The adapter over its lifetime: retry after outages, a dead writer, shutdown with a sink that
//! stopped reading. Every test runs with the default flags (coalescing on).

mod common;

use std::time::Duration;

use common::*;
use futures::stream::{BoxStream, StreamExt};
use mcp_core::registry::{Registry, RegistryError, RegistryEvent};
use mcp_core::retry::Backoff;
use mcp_core::testing::{metric_sum, mk_service};
use mcp_runtime::runtime::{self, RunError, SHUTDOWN_GRACE};
use mcp_runtime::testing::test_args;

fn problems_then_reset(a: &Adapter) {
    // ZooKeeper and Consul report what they skipped before their full state.
    a.handle.send(RegistryEvent::Problems {
        scope: "zone-a".into(),
        problems: Vec::new(),
    });
    a.handle
        .send(RegistryEvent::Reset(vec![mk_service("a", 1)]));
}

async fn wait_registry_healthy(a: &Adapter, within: Duration) -> Duration {
    let start = tokio::time::Instant::now();
    loop {
        let (code, _) = http_get(a.admin(), "/registryz").await;
        if code == 200 {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "registry not healthy again within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// After a watch that delivered its full state and stayed up, the next outage is retried at
/// once, even when the watch sends `Problems` before its `Reset` (as ZooKeeper and Consul do) and
/// that arrives within one coalescing window. Earlier the delay only reset when the *first* event
/// of a watch was a `Reset`, so it stayed at its highest value for the adapter's lifetime.
#[tokio::test]
async fn the_retry_delay_starts_over_after_a_stable_watch() {
    let a = Adapter::start().await;
    problems_then_reset(&a);
    a.wait_readyz(200).await;

    // Five watches that fail at once: the delay grows to 1.6 s (with jitter: 0.8-1.6 s).
    for _ in 0..5 {
        a.handle
            .fail(RegistryError::Unavailable("connection refused".into()));
    }
    problems_then_reset(&a);
    wait_registry_healthy(&a, Duration::from_secs(10)).await;

    // Up for longer than the stable period: the next failure is retried after ~100 ms.
    tokio::time::sleep(Backoff::STABLE + Duration::from_millis(500)).await;
    a.handle
        .fail(RegistryError::Unavailable("connection refused".into()));
    problems_then_reset(&a);
    let took = wait_registry_healthy(&a, Duration::from_secs(10)).await;
    assert!(
        took < Duration::from_millis(1500),
        "recovered after {took:?}; the delay did not start over"
    );

    // Steady state: the re-lists changed nothing, so nothing was published after the first sync.
    let m = a.metrics().await;
    assert_eq!(
        metric(
            &m,
            r#"mcp_adapter_snapshots_total{reason="change",registry="fake"}"#
        ),
        None,
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            r#"mcp_adapter_registry_errors_total{kind="unavailable",registry="fake"}"#
        ),
        Some(6.0),
        "{m}"
    );
    a.stop().await;
}

/// A registry whose watch panics in the writer task after its first full state.
struct PanicsAfterSync;

impl Registry for PanicsAfterSync {
    const NAME: &'static str = "panics";
    const DEFAULT_HOST_SUFFIX: &'static str = "panics.local";
    const DEFAULT_NAMESPACE: &'static str = "panics";

    fn watch(&self) -> BoxStream<'static, Result<RegistryEvent, RegistryError>> {
        let first = futures::stream::iter(vec![Ok(RegistryEvent::Reset(vec![mk_service("a", 1)]))]);
        let boom = futures::stream::once(async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            panic!("a bug in the writer's path");
        });
        first.chain(boom).boxed()
    }
}

/// A writer that died must not leave a process that serves a frozen set and says it is ready:
/// the adapter stops with an error (the binary exits non-zero and is restarted).
#[tokio::test]
async fn a_dead_writer_stops_the_adapter() {
    let mut running = runtime::start(PanicsAfterSync, test_args())
        .await
        .expect("starts");
    // What the binary's main loop waits on (besides signals).
    tokio::time::timeout(STEP, running.shutdown.cancelled())
        .await
        .expect("the writer's death stops the adapter");
    let result = tokio::time::timeout(STEP, running.wait())
        .await
        .expect("the adapter stopped by itself");
    assert!(
        matches!(result, Err(RunError::Join(_))),
        "stopped with the writer's failure: {result:?}"
    );
    assert!(
        tokio::net::TcpStream::connect(running.admin_addr)
            .await
            .is_err(),
        "the admin port (and with it /readyz) is gone"
    );
}

/// Shutdown ends within its grace period even when a sink stopped reading while responses were
/// waiting for it (before, the stream task waited on the full channel forever).
#[tokio::test]
async fn shutdown_does_not_wait_for_a_sink_that_stopped_reading() {
    let a = Adapter::start().await;
    // ~5 MB per full-state response: more than HTTP/2 lets in flight for one stream.
    a.handle.send(RegistryEvent::Reset(
        (0..60)
            .map(|i| mk_service(&format!("s{i}"), 2000))
            .collect(),
    ));
    a.wait_readyz(200).await;
    let s = a.xds().await;
    for t in [SE_V1, SE_V1BETA1, SE_V1ALPHA3] {
        s.send(xds_req(t, ""));
    }
    for i in 0..8 {
        s.send(xds_req(&format!("example.com/v1/Other{i}"), ""));
    }
    // Let the server fill the pipe; the sink reads nothing.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let Adapter {
        mut running,
        handle: _handle,
    } = a;
    let start = tokio::time::Instant::now();
    running.shutdown.cancel();
    let result = tokio::time::timeout(SHUTDOWN_GRACE + Duration::from_secs(5), running.wait())
        .await
        .expect("shutdown finished within its grace period");
    assert!(result.is_ok(), "{result:?}");
    assert!(
        start.elapsed() <= SHUTDOWN_GRACE + Duration::from_secs(2),
        "took {:?}",
        start.elapsed()
    );
    drop(s);
}

/// `--state-file`: an adapter restarted while its registry is down serves the last good set,
/// with the same versions as before (a reconnecting istiod sees no change), is ready, and says
/// the registry is not in sync; the first real sync replaces it.
#[tokio::test]
async fn a_restart_during_an_outage_serves_the_saved_state() {
    let path = std::env::temp_dir().join(format!("mcp-lifecycle-state-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let mut args = test_args();
    args.state_file = Some(path.clone());

    let first = Adapter::start_with(args.clone()).await;
    first.handle.send(RegistryEvent::Reset(vec![
        mk_service("a", 1),
        mk_service("b", 2),
    ]));
    first.wait_served(&["fake/a", "fake/b"]).await;
    let mut s = first.xds().await;
    s.send(xds_req(SE_V1, ""));
    let before = s.recv().await;
    drop(s);
    first.stop().await;

    // The registry is down: the new process's watch never delivers anything.
    let second = Adapter::start_with(args).await;
    let body = second.wait_readyz(200).await;
    assert!(body.contains("restored"), "{body}");
    assert_eq!(http_get(second.admin(), "/registryz").await.0, 503);
    let mut s = second.xds().await;
    s.send(xds_req(SE_V1, ""));
    let after = s.recv().await;
    assert_eq!(
        after.version_info, before.version_info,
        "same snapshot version"
    );
    assert_eq!(decode_xds(&after), decode_xds(&before), "same resources");
    s.send(xds_ack(&after));

    // The registry answers: its state replaces the restored one.
    second
        .handle
        .send(RegistryEvent::Reset(vec![mk_service("a", 1)]));
    let r = s.recv().await;
    assert_eq!(names(&decode_xds(&r)), vec!["fake/a"]);
    second.wait_http("/registryz", 200).await;
    second.stop().await;
    let _ = std::fs::remove_file(&path);
}

/// A watch that resumes by itself after an error (`Retrying`) keeps its place: the registry is
/// unhealthy with the reason while it retries, healthy again on `Recovered`, and nothing is
/// counted as a failed watch, re-sent or re-published; later changes flow on the same watch.
#[tokio::test]
async fn a_watch_that_resumes_by_itself_is_unhealthy_meanwhile_but_not_restarted() {
    let a = Adapter::start().await;
    a.handle
        .send(RegistryEvent::Reset(vec![mk_service("a", 1)]));
    a.wait_served(&["fake/a"]).await;
    a.wait_http("/registryz", 200).await;
    let snapshots = metric_sum(&a.metrics().await, "mcp_adapter_snapshots_total");

    a.handle
        .send(RegistryEvent::Retrying(RegistryError::Unavailable(
            "list/watch services: connection refused".into(),
        )));
    let body = a.wait_http("/registryz", 503).await;
    assert!(body.contains("connection refused"), "{body}");
    a.wait_readyz(200).await;
    let metrics = a.metrics().await;
    assert_eq!(metric_sum(&metrics, "mcp_adapter_registry_healthy"), 0.0);
    assert_eq!(
        metric_sum(&metrics, "mcp_adapter_registry_retries_total"),
        1.0
    );
    assert_eq!(
        metric_sum(&metrics, "mcp_adapter_registry_errors_total"),
        0.0
    );

    a.handle.send(RegistryEvent::Recovered);
    a.wait_http("/registryz", 200).await;
    let metrics = a.metrics().await;
    assert_eq!(metric_sum(&metrics, "mcp_adapter_registry_healthy"), 1.0);
    assert_eq!(
        metric_sum(&metrics, "mcp_adapter_registry_errors_total"),
        0.0
    );
    assert_eq!(
        metric_sum(&metrics, "mcp_adapter_snapshots_total"),
        snapshots,
        "no new snapshot for an outage that changed nothing"
    );

    // The same watch goes on.
    a.handle.send(RegistryEvent::Upsert(mk_service("b", 1)));
    a.wait_served(&["fake/a", "fake/b"]).await;
    a.stop().await;
}
