//! Admin HTTP: /healthz, /readyz, /metrics, /debug/resources.

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
    /// Served set.
    pub snapshots: watch::Receiver<Option<Arc<Snapshot>>>,
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
        .route("/metrics", get(metrics))
        .route("/debug/resources", get(debug_resources))
        .with_state(state);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

async fn readyz(State(s): State<AdminState>) -> impl IntoResponse {
    let st = s.status.lock().clone();
    if st.ready() {
        (StatusCode::OK, "ready\n".to_string())
    } else if !st.synced {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "not ready: waiting for the first sync from {}{}\n",
                s.registry,
                st.last_error
                    .map(|e| format!(" (last error: {e})"))
                    .unwrap_or_default()
            ),
        )
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "not ready: {} unreachable for {}s, serving the last good state ({})\n",
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
    #[serde(flatten)]
    summary: &'a Summary,
}

async fn debug_resources(State(s): State<AdminState>) -> impl IntoResponse {
    let st = s.status.lock().clone();
    let snapshot = s.snapshots.borrow().clone();
    let resources: Vec<serde_json::Value> = snapshot
        .iter()
        .flat_map(|snap| snap.entries.iter())
        .filter_map(|e| {
            serde_json::to_value(Served {
                name: &e.name,
                version: &e.version,
                summary: &e.summary,
            })
            .ok()
        })
        .collect();
    Json(serde_json::json!({
        "registry": s.registry,
        "source": s.source,
        "synced": st.synced,
        "healthy": st.healthy,
        "lastError": st.last_error,
        "stalenessSeconds": st.staleness_secs(),
        "version": snapshot.as_ref().map(|s| s.version.clone()),
        "resources": resources,
        "quarantined": st.quarantine,
        "problems": st.problems,
    }))
}
