//! `mcpctl health` against the adapter runtime itself (a test registry behind it): not ready
//! before the first sync, ready after, and a clear error for a port that does not answer.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use mcp_core::testing::{fake_registry, mk_service};
use mcp_core::RegistryEvent;
use mcp_runtime::runtime;
use mcp_runtime::testing::test_args;
use mcpctl::health::{readyz, HealthError};

const STEP: Duration = Duration::from_secs(10);

#[tokio::test]
async fn follows_the_adapters_readiness() {
    let (registry, handle) = fake_registry();
    let running = runtime::start(registry, test_args()).await.unwrap();
    let admin = running.admin_addr;

    let r = readyz(&admin.to_string(), STEP).await.unwrap();
    assert_eq!(r.status, 503, "{r:?}");
    assert!(!r.ready());
    assert!(
        r.body
            .starts_with("not ready: waiting for the first sync from fake"),
        "{r:?}"
    );

    handle.send(RegistryEvent::Reset(vec![mk_service("a", 1)]));
    // As the adapter's own MCP_ADMIN_LISTEN gives it in a container: 0.0.0.0, dialed on loopback.
    let listen = format!("0.0.0.0:{}", admin.port());
    let deadline = Instant::now() + STEP;
    loop {
        let r = readyz(&listen, STEP).await.unwrap();
        if r.ready() {
            assert_eq!(r.body, "ready");
            break;
        }
        assert!(Instant::now() < deadline, "never ready: {r:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    running.stop().await.unwrap();

    // Stopped: the port refuses, and the error says which port.
    let err = readyz(&admin.to_string(), STEP).await.unwrap_err();
    assert!(matches!(err, HealthError::Io { .. }), "{err:?}");
    assert!(err.to_string().contains(&admin.to_string()), "{err}");
}

#[tokio::test]
async fn a_port_that_never_answers_times_out() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Accepts and holds the connection without a word.
    let held = tokio::spawn(async move {
        let conn = listener.accept().await;
        tokio::time::sleep(Duration::from_secs(30)).await;
        drop(conn);
    });
    let started = Instant::now();
    let err = readyz(&addr.to_string(), Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(err, HealthError::Timeout { .. }), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    held.abort();
}
