//! Admin HTTP: /healthz (alive), /readyz (has a state worth serving), /registryz (registry in
//! sync), /metrics, /debug/resources, /debug/syncz (what each sink was sent and acknowledged).

mod debug;
mod syncz;

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::status::SharedStatus;
use mcp_core::cache::Snapshot;
use mcp_core::metrics::Metrics;
use mcp_server::sync_status::SyncBoard;

/// What the handlers read.
#[derive(Clone, Debug)]
pub struct AdminState {
    /// Registry type.
    pub registry: &'static str,
    /// Source name.
    pub source: String,
    /// Health and debug state.
    pub status: SharedStatus,
    /// Served set, per shard (one without `--shards`).
    pub snapshots: Vec<watch::Receiver<Option<Arc<Snapshot>>>>,
    /// gRPC address of each shard.
    pub grpc_addrs: Vec<std::net::SocketAddr>,
    /// Metrics.
    pub metrics: Metrics,
    /// Every sink stream's sync status.
    pub sync: Arc<SyncBoard>,
}

/// Serves the admin endpoints until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AdminState,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/registryz", get(registryz))
        .route("/metrics", get(metrics))
        .route("/debug/resources", get(debug::resources))
        .route("/debug/syncz", get(syncz::syncz))
        .with_state(state);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

/// Readiness: a state worth serving exists (synced once). Stays 200 through registry outages,
/// with the staleness in the body; 503 only before the first sync.
async fn readyz(State(s): State<AdminState>) -> impl IntoResponse {
    let p = Probe::read(&s.status);
    let (code, body) = readiness(s.registry, &p);
    (code, p.with_output_line(body))
}

/// What the probes read, copied in one short lock: a few flags and the error texts (cut where
/// they are stored, see `clip`), never the quarantine or problem lists nor the served set, so a
/// probe costs the same at 10 services as at 100k. Kubernetes probes every few seconds, Docker's
/// HEALTHCHECK too (`mcpctl health`).
#[derive(Debug)]
struct Probe {
    ready: bool,
    synced: bool,
    healthy: bool,
    staleness: u64,
    last_error: Option<String>,
    /// The Kubernetes output's line and whether it fails, when the output is on.
    output: Option<(String, bool)>,
}

impl Probe {
    fn read(status: &SharedStatus) -> Self {
        let st = status.lock();
        Probe {
            ready: st.ready(),
            synced: st.synced,
            healthy: st.healthy,
            staleness: st.staleness_secs(),
            last_error: st.last_error.clone(),
            output: st.output.as_ref().map(|o| {
                let o = o.lock();
                (o.summary(), o.failing())
            }),
        }
    }

    /// The body with the Kubernetes output's line (leadership, how far the API server is
    /// behind) when the output is on.
    fn with_output_line(&self, mut body: String) -> String {
        if let Some((line, _)) = &self.output {
            body.push_str(line);
            body.push('\n');
        }
        body
    }
}

fn readiness(registry: &str, p: &Probe) -> (StatusCode, String) {
    if !p.ready {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "not ready: waiting for the first sync from {registry}{}\n",
                last_error_suffix(p.last_error.as_deref())
            ),
        );
    }
    if p.healthy {
        (StatusCode::OK, "ready\n".to_string())
    } else if !p.synced {
        (
            StatusCode::OK,
            format!(
                "ready: serving the state restored from --state-file (written {}s ago); waiting for the first sync from {registry}{}\n",
                p.staleness,
                last_error_suffix(p.last_error.as_deref())
            ),
        )
    } else {
        (
            StatusCode::OK,
            format!(
                "ready: serving the last good state; {registry} unreachable for {}s ({})\n",
                p.staleness,
                p.last_error.as_deref().unwrap_or_default()
            ),
        )
    }
}

/// ` (last error: ...)` when there is one.
fn last_error_suffix(e: Option<&str>) -> String {
    e.map(|e| format!(" (last error: {e})")).unwrap_or_default()
}

/// Registry health: 200 while the watch is in sync with the registry, 503 (with the reason)
/// before the first sync and while it cannot be reached. For alerts and dashboards, not for a
/// readiness probe (see `/readyz`).
/// With the Kubernetes output on, a failure to write (or to hold the Lease) makes it 503 too:
/// the mesh is then behind the registry.
async fn registryz(State(s): State<AdminState>) -> impl IntoResponse {
    let p = Probe::read(&s.status);
    let (mut code, body) = registry_health(s.registry, &p);
    if p.output.as_ref().is_some_and(|(_, failing)| *failing) {
        code = StatusCode::SERVICE_UNAVAILABLE;
    }
    (code, p.with_output_line(body))
}

fn registry_health(registry: &str, p: &Probe) -> (StatusCode, String) {
    if p.healthy {
        (StatusCode::OK, format!("{registry} healthy\n"))
    } else if !p.synced {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "{registry} not synced yet{}\n",
                last_error_suffix(p.last_error.as_deref())
            ),
        )
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "{registry} unhealthy for {}s: {}\n",
                p.staleness,
                p.last_error.as_deref().unwrap_or_default()
            ),
        )
    }
}

async fn metrics(State(s): State<AdminState>) -> impl IntoResponse {
    {
        let st = s.status.lock();
        s.metrics.registry_healthy.set(i64::from(st.healthy));
        s.metrics.sync_age.set(st.staleness_secs() as i64);
    }
    (
        [("content-type", "text/plain; version=0.0.4")],
        s.metrics.render(),
    )
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant, SystemTime};

    use axum::response::Response;

    use super::*;
    use mcp_core::clip::{clip_error, ERROR_TEXT_MAX};
    use mcp_core::index::Quarantined;

    fn state() -> AdminState {
        AdminState {
            registry: "fake",
            source: "fake".into(),
            status: SharedStatus::default(),
            snapshots: vec![watch::channel(None).1],
            grpc_addrs: vec![std::net::SocketAddr::from(([127, 0, 0, 1], 15051))],
            metrics: Metrics::new("fake").expect("metrics"),
            sync: crate::testing::sync_board(),
        }
    }

    async fn text(r: Response) -> (u16, String) {
        let code = r.status().as_u16();
        let body = axum::body::to_bytes(r.into_body(), 1 << 20)
            .await
            .expect("body");
        (code, String::from_utf8_lossy(&body).into_owned())
    }

    async fn probe(s: &AdminState, path: &str) -> (u16, String) {
        let r = match path {
            "/readyz" => readyz(State(s.clone())).await.into_response(),
            _ => registryz(State(s.clone())).await.into_response(),
        };
        text(r).await
    }

    /// A registry that fails with a page-sized answer while 100k services are quarantined and
    /// 100k scopes hold problems: each probe reads a few fields (no copy of the lists), and
    /// answers a line, not the page.
    #[tokio::test]
    async fn probes_read_a_few_fields_whatever_the_lists_hold() {
        let s = state();
        {
            let mut st = s.status.lock();
            st.synced = true;
            st.healthy = false;
            st.last_good = Some(SystemTime::now());
            st.last_error = Some(clip_error(format!(
                "consul answered /v1/catalog/services with HTTP 502: {}",
                "<p>bad gateway</p>".repeat(60_000)
            )));
            st.quarantine = (0..100_000)
                .map(|i| Quarantined {
                    key: format!("ns/svc-{i}"),
                    origin: format!("consul service svc-{i}"),
                    reasons: vec![format!("spec.ports[0].number: 0 is not a port ({i})")],
                    serving_last_good: true,
                })
                .collect();
            st.problems = (0..100_000)
                .map(|i| (format!("scope {i}"), vec![format!("bad object {i}")]))
                .collect();
        }
        let (code, ready) = probe(&s, "/readyz").await;
        assert_eq!(code, 200, "{ready}");
        assert!(
            ready.starts_with("ready: serving the last good state; fake unreachable for"),
            "{ready}"
        );
        assert!(ready.contains(" bytes cut]"), "{ready}");
        assert!(ready.len() < ERROR_TEXT_MAX + 200, "{}", ready.len());
        let (code, registry) = probe(&s, "/registryz").await;
        assert_eq!(code, 503);
        assert!(registry.len() < ERROR_TEXT_MAX + 200, "{}", registry.len());

        // Copying the lists would cost milliseconds per probe (seconds for these 2,000); reading
        // the fields costs microseconds.
        let started = Instant::now();
        for _ in 0..1000 {
            probe(&s, "/readyz").await;
            probe(&s, "/registryz").await;
        }
        let took = started.elapsed();
        assert!(took < Duration::from_secs(1), "2,000 probes took {took:?}");
    }

    #[tokio::test]
    async fn readiness_follows_the_first_sync_and_the_state_file() {
        let s = state();
        s.status.lock().last_error = Some("connection refused".into());
        let (code, body) = probe(&s, "/readyz").await;
        assert_eq!(code, 503);
        assert_eq!(
            body,
            "not ready: waiting for the first sync from fake (last error: connection refused)\n"
        );
        s.status.lock().restored = true;
        let (code, body) = probe(&s, "/readyz").await;
        assert_eq!(code, 200);
        assert!(
            body.starts_with("ready: serving the state restored"),
            "{body}"
        );
        {
            let mut st = s.status.lock();
            st.synced = true;
            st.healthy = true;
            st.last_error = None;
        }
        assert_eq!(probe(&s, "/readyz").await, (200, "ready\n".into()));
        assert_eq!(
            probe(&s, "/registryz").await,
            (200, "fake healthy\n".into())
        );
    }
}
