//! Admin HTTP: /healthz (alive), /readyz (has a state worth serving), /registryz (registry in
//! sync), /metrics, /debug/resources.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::cache::{Snapshot, Summary};
use crate::metrics::Metrics;
use crate::status::SharedStatus;

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
        .route("/debug/resources", get(debug_resources))
        .with_state(state);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

/// Readiness: a state worth serving exists (synced once). Stays 200 through registry outages,
/// with the staleness in the body; 503 only before the first sync.
async fn readyz(State(s): State<AdminState>) -> impl IntoResponse {
    let (code, body) = readiness(&s);
    (code, with_output_line(&s, body))
}

/// The body with the Kubernetes output's line (leadership, how far the API server is behind)
/// when the output is on.
fn with_output_line(s: &AdminState, mut body: String) -> String {
    if let Some(o) = s.status.lock().output.as_ref() {
        body.push_str(&o.summary());
        body.push('\n');
    }
    body
}

fn readiness(s: &AdminState) -> (StatusCode, String) {
    let st = s.status.lock().clone();
    if !st.ready() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "not ready: waiting for the first sync from {}{}\n",
                s.registry,
                last_error_suffix(st.last_error.as_deref())
            ),
        );
    }
    if st.healthy {
        (StatusCode::OK, "ready\n".to_string())
    } else if !st.synced {
        (
            StatusCode::OK,
            format!(
                "ready: serving the state restored from --state-file (written {}s ago); waiting for the first sync from {}{}\n",
                st.staleness_secs(),
                s.registry,
                last_error_suffix(st.last_error.as_deref())
            ),
        )
    } else {
        (
            StatusCode::OK,
            format!(
                "ready: serving the last good state; {} unreachable for {}s ({})\n",
                s.registry,
                st.staleness_secs(),
                st.last_error.unwrap_or_default()
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
    let (mut code, body) = registry_health(&s);
    let output_failing = s.status.lock().output.as_ref().is_some_and(|o| o.failing());
    if output_failing {
        code = StatusCode::SERVICE_UNAVAILABLE;
    }
    (code, with_output_line(&s, body))
}

fn registry_health(s: &AdminState) -> (StatusCode, String) {
    let st = s.status.lock().clone();
    if st.healthy {
        (StatusCode::OK, format!("{} healthy\n", s.registry))
    } else if !st.synced {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "{} not synced yet{}\n",
                s.registry,
                last_error_suffix(st.last_error.as_deref())
            ),
        )
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "{} unhealthy for {}s: {}\n",
                s.registry,
                st.staleness_secs(),
                st.last_error.unwrap_or_default()
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

#[derive(serde::Serialize)]
struct Served<'a> {
    name: &'a str,
    version: &'a str,
    /// `--shards`: which shard serves it.
    #[serde(skip_serializing_if = "Option::is_none")]
    shard: Option<usize>,
    #[serde(flatten)]
    summary: &'a Summary,
}

/// One shard of a `--shards` source, for `/debug/resources`.
#[derive(serde::Serialize)]
struct ShardView {
    shard: usize,
    address: String,
    version: Option<String>,
    resources: usize,
}

async fn debug_resources(State(s): State<AdminState>) -> impl IntoResponse {
    let st = s.status.lock().clone();
    let snapshots: Vec<Option<Arc<Snapshot>>> =
        s.snapshots.iter().map(|rx| rx.borrow().clone()).collect();
    let sharded = snapshots.len() > 1;
    let resources: Vec<serde_json::Value> = snapshots
        .iter()
        .enumerate()
        .flat_map(|(i, snap)| {
            snap.iter()
                .flat_map(move |snap| snap.iter().map(move |e| (i, e)))
        })
        .filter_map(|(i, e)| {
            serde_json::to_value(Served {
                name: &e.name,
                version: &e.version,
                shard: sharded.then_some(i),
                summary: &e.summary,
            })
            .ok()
        })
        .collect();
    let mut body = serde_json::json!({
        "registry": s.registry,
        "source": s.source,
        "synced": st.synced,
        "restored": st.restored,
        "healthy": st.healthy,
        "lastError": st.last_error,
        "stalenessSeconds": st.staleness_secs(),
        "version": snapshots.first().and_then(|s| s.as_ref()).map(|s| s.version.clone()).filter(|_| !sharded),
        "resources": resources,
        "quarantined": st.quarantine,
        "problems": st.problems,
    });
    if let Some(o) = &st.output {
        body["kubeOutput"] = o.to_json();
    }
    if sharded {
        let shards: Vec<ShardView> = snapshots
            .iter()
            .zip(&s.grpc_addrs)
            .enumerate()
            .map(|(shard, (snap, addr))| ShardView {
                shard,
                address: addr.to_string(),
                version: snap.as_ref().map(|s| s.version.clone()),
                resources: snap.as_ref().map_or(0, |s| s.len()),
            })
            .collect();
        body["shards"] = serde_json::json!(shards);
    }
    Json(body)
}
