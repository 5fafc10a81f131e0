//! `/debug/syncz`: per connected sink (node id, address, protocol, type URL), the version it was
//! sent, the version it acknowledged and since when, and why it rejected a response; beside the
//! version each shard serves now, so that "acknowledged" can be read as "has what the registry
//! holds". `mcpctl status` prints it as a table across several adapters.
//!
//! The answer grows with the open streams, which `--max-streams` bounds (a few hundred bytes
//! each), never with the registry.

use std::time::SystemTime;

use axum::extract::State;
use axum::Json;
use serde::Serialize;

use super::AdminState;
use mcp_server::sync_status::SinkSync;

/// What one shard serves now.
#[derive(Serialize)]
struct Served {
    shard: usize,
    /// `None` before the first registry sync.
    version: Option<String>,
    resources: usize,
}

#[derive(Serialize)]
struct Syncz {
    registry: &'static str,
    source: String,
    /// This adapter's clock (Unix seconds): ages are read against it, not the reader's.
    now: f64,
    served: Vec<Served>,
    sinks: Vec<SinkSync>,
}

pub(super) async fn syncz(State(s): State<AdminState>) -> Json<serde_json::Value> {
    let served = s
        .snapshots
        .iter()
        .enumerate()
        .map(|(shard, rx)| {
            let snap = rx.borrow().clone();
            Served {
                shard,
                version: snap.as_ref().map(|s| s.version.clone()),
                resources: snap.as_ref().map_or(0, |s| s.len()),
            }
        })
        .collect();
    let answer = Syncz {
        registry: s.registry,
        source: s.source.clone(),
        now: SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()),
        served,
        sinks: s.sync.list(),
    };
    Json(serde_json::to_value(answer).unwrap_or_default())
}
