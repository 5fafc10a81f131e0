//! Sync status per sink: what each connected sink was sent, what it acknowledged and since when,
//! and why it rejected a response. istiod exposes nothing about the health of its
//! `configSources` clients, so only the source can answer "has every istiod got what the
//! registry holds?" (`/debug/syncz`, `mcpctl status`, `mcp_adapter_sink_subscriptions`).
//!
//! Each stream's [`crate::engine::Engine`] keeps a [`TypeRecord`] per served type, updated where
//! it sends, takes an ACK or a NACK; the stream copies them to the shared [`SyncBoard`] after
//! each step (a few strings per type: the board is written once per response or request, never
//! per resource). The board keeps the per-state gauge by difference, so a step costs its own
//! types, not every stream's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use mcp_core::clip::clip;
use prometheus::IntGaugeVec;

/// Most bytes of a sink's NACK detail kept (the sink writes it; the rest is in its own log).
const MAX_DETAIL: usize = 512;
/// Most bytes of a node id kept for display.
const MAX_NODE: usize = 256;

/// Where a (sink stream, served type) pair stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SyncState {
    /// Subscribed, nothing sent yet (before the first registry sync).
    NotSent,
    /// A response is in flight, not acknowledged yet.
    Pending,
    /// The sink acknowledged the newest response sent; nothing in flight.
    Synced,
    /// The sink rejected the last response and has acknowledged none since.
    Nacked,
}

impl SyncState {
    /// Every state, in the order they are shown.
    pub const ALL: [SyncState; 4] = [Self::NotSent, Self::Pending, Self::Synced, Self::Nacked];

    /// The metric label (and JSON value).
    pub fn label(self) -> &'static str {
        match self {
            Self::NotSent => "not_sent",
            Self::Pending => "pending",
            Self::Synced => "synced",
            Self::Nacked => "nacked",
        }
    }
}

/// A version and when it happened.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Stamped {
    /// Snapshot version.
    pub version: String,
    /// When (wall clock: shown to people, never used to decide).
    #[serde(serialize_with = "unix_seconds")]
    pub at: SystemTime,
}

/// A rejected response.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct NackRecord {
    /// The version rejected.
    pub version: String,
    /// The sink's reason, clipped.
    pub detail: String,
    /// When.
    #[serde(serialize_with = "unix_seconds")]
    pub at: SystemTime,
}

/// One served type on one stream: kept by the engine.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TypeRecord {
    /// The newest version sent.
    pub sent: Option<Stamped>,
    /// The newest version the sink holds by its own ACK.
    pub acked: Option<Stamped>,
    /// The last rejection, until an ACK.
    pub nack: Option<NackRecord>,
    /// A response is in flight (shown as the state).
    #[serde(skip)]
    pub in_flight: bool,
}

impl TypeRecord {
    /// A response of `version` went out.
    pub(crate) fn sent(&mut self, version: &str) {
        self.sent = Some(Stamped {
            version: version.to_string(),
            at: SystemTime::now(),
        });
        self.in_flight = true;
    }

    /// The response in flight was acknowledged.
    pub(crate) fn acked(&mut self) {
        self.in_flight = false;
        self.nack = None;
        if let Some(sent) = &self.sent {
            self.acked = Some(Stamped {
                version: sent.version.clone(),
                at: SystemTime::now(),
            });
        }
    }

    /// The response in flight was rejected.
    pub(crate) fn nacked(&mut self, detail: &str) {
        self.in_flight = false;
        let version = self
            .sent
            .as_ref()
            .map(|s| s.version.clone())
            .unwrap_or_default();
        self.nack = Some(NackRecord {
            version,
            detail: clip(detail, MAX_DETAIL).into_owned(),
            at: SystemTime::now(),
        });
    }

    /// A new version changed nothing this sink is subscribed to (incremental: nothing is sent):
    /// what it acknowledged is that version's content.
    pub(crate) fn unchanged(&mut self, version: &str) {
        if self.in_flight || self.nack.is_some() {
            return;
        }
        let now = SystemTime::now();
        self.sent = Some(Stamped {
            version: version.to_string(),
            at: now,
        });
        self.acked = Some(Stamped {
            version: version.to_string(),
            at: now,
        });
    }

    /// Where it stands.
    pub fn state(&self) -> SyncState {
        if self.in_flight {
            SyncState::Pending
        } else if self.nack.is_some() {
            SyncState::Nacked
        } else if self.acked.is_some() {
            SyncState::Synced
        } else {
            SyncState::NotSent
        }
    }
}

/// One served type of a stream, as the board shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TypeSync {
    /// Type URL (or legacy collection), as the sink asked for it.
    pub type_url: String,
    /// Where it stands.
    pub state: SyncState,
    /// What was sent, acknowledged, rejected.
    #[serde(flatten)]
    pub record: TypeRecord,
}

/// One sink stream.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SinkSync {
    /// The node id the sink gave (istiod's pod, adsc's `--node`), clipped; `None` until it
    /// gives one (legacy MCP sinks may not).
    pub node: Option<String>,
    /// The sink's address.
    pub peer: String,
    /// Protocol (`xds`, `delta`, `mcp`, ...).
    pub protocol: &'static str,
    /// `--shards`: the shard whose port it is on.
    pub shard: Option<String>,
    /// When the stream opened.
    #[serde(serialize_with = "unix_seconds")]
    pub connected: SystemTime,
    /// Its served types.
    pub types: Vec<TypeSync>,
}

/// Every open sink stream's sync status, and the `mcp_adapter_sink_subscriptions` gauge.
#[derive(Debug)]
pub struct SyncBoard {
    sinks: Mutex<HashMap<u64, SinkSync>>,
    next: AtomicU64,
    gauge: IntGaugeVec,
}

impl SyncBoard {
    /// An empty board counting into `gauge` (labels: protocol, state).
    pub fn new(gauge: IntGaugeVec) -> Arc<Self> {
        Arc::new(Self {
            sinks: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
            gauge,
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, SinkSync>> {
        // Every update is applied whole under the lock: a poisoned one is still consistent.
        self.sinks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A stream opened; it leaves the board when the entry is dropped.
    pub fn join(
        self: &Arc<Self>,
        protocol: &'static str,
        peer: &str,
        shard: Option<&str>,
    ) -> SinkEntry {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(
            id,
            SinkSync {
                node: None,
                peer: peer.to_string(),
                protocol,
                shard: shard.map(str::to_string),
                connected: SystemTime::now(),
                types: Vec::new(),
            },
        );
        SinkEntry {
            board: self.clone(),
            id,
        }
    }

    fn count(&self, protocol: &str, types: &[TypeSync], by: i64) {
        for t in types {
            self.gauge
                .with_label_values(&[protocol, t.state.label()])
                .add(by);
        }
    }

    /// Every open stream, by node id then peer.
    pub fn list(&self) -> Vec<SinkSync> {
        let mut all: Vec<SinkSync> = self.lock().values().cloned().collect();
        all.sort_by(|a, b| (&a.node, &a.peer).cmp(&(&b.node, &b.peer)));
        all
    }
}

/// A stream's place on the board.
#[derive(Debug)]
pub struct SinkEntry {
    board: Arc<SyncBoard>,
    id: u64,
}

impl SinkEntry {
    /// The sink gave its node id.
    pub fn identify(&self, node: &str) {
        if let Some(s) = self.board.lock().get_mut(&self.id) {
            s.node = Some(clip(node, MAX_NODE).into_owned());
        }
    }

    /// The stream's served types now; the gauge moves by the difference.
    pub fn update(&self, types: Vec<TypeSync>) {
        let mut sinks = self.board.lock();
        let Some(s) = sinks.get_mut(&self.id) else {
            return;
        };
        if s.types == types {
            return;
        }
        self.board.count(s.protocol, &s.types, -1);
        self.board.count(s.protocol, &types, 1);
        s.types = types;
    }
}

impl Drop for SinkEntry {
    fn drop(&mut self) {
        let removed = self.board.lock().remove(&self.id);
        if let Some(s) = removed {
            self.board.count(s.protocol, &s.types, -1);
        }
    }
}

fn unix_seconds<S: serde::Serializer>(at: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    let secs = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    s.serialize_f64((secs * 1000.0).round() / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::Opts;

    fn board() -> Arc<SyncBoard> {
        let gauge = IntGaugeVec::new(Opts::new("g", "g"), &["protocol", "state"]).expect("gauge");
        SyncBoard::new(gauge)
    }

    fn gauge(b: &SyncBoard, state: SyncState) -> i64 {
        b.gauge.with_label_values(&["xds", state.label()]).get()
    }

    fn typed(r: &TypeRecord) -> Vec<TypeSync> {
        vec![TypeSync {
            type_url: "se".into(),
            state: r.state(),
            record: r.clone(),
        }]
    }

    #[test]
    fn a_record_goes_sent_acked_nacked_and_back() {
        let mut r = TypeRecord::default();
        assert_eq!(r.state(), SyncState::NotSent);
        r.sent("v1");
        assert_eq!(r.state(), SyncState::Pending);
        r.acked();
        assert_eq!(r.state(), SyncState::Synced);
        assert_eq!(r.acked.as_ref().map(|a| a.version.as_str()), Some("v1"));
        r.sent("v2");
        r.nacked(&"x".repeat(2000));
        assert_eq!(r.state(), SyncState::Nacked);
        let nack = r.nack.clone().expect("nack");
        assert_eq!(nack.version, "v2");
        assert!(nack.detail.len() < 600, "clipped: {}", nack.detail.len());
        assert_eq!(
            r.acked.as_ref().map(|a| a.version.as_str()),
            Some("v1"),
            "the sink still holds v1"
        );
        // A version that changes nothing for the sink does not hide the rejection.
        r.unchanged("v3");
        assert_eq!(r.state(), SyncState::Nacked);
        r.sent("v4");
        r.acked();
        assert_eq!(r.state(), SyncState::Synced);
        assert!(r.nack.is_none());
        r.unchanged("v5");
        assert_eq!(r.acked.as_ref().map(|a| a.version.as_str()), Some("v5"));
    }

    #[test]
    fn the_gauge_follows_streams_and_leaves_with_them() {
        let b = board();
        let one = b.join("xds", "127.0.0.1:1", None);
        let two = b.join("xds", "127.0.0.1:2", Some("1"));
        two.identify("sidecar~1.2.3.4~istiod-0.istio-system~cluster.local");
        let mut r = TypeRecord::default();
        one.update(typed(&r));
        two.update(typed(&r));
        assert_eq!(gauge(&b, SyncState::NotSent), 2);
        r.sent("v1");
        one.update(typed(&r));
        assert_eq!(gauge(&b, SyncState::NotSent), 1);
        assert_eq!(gauge(&b, SyncState::Pending), 1);
        r.nacked("bad");
        one.update(typed(&r));
        assert_eq!(gauge(&b, SyncState::Pending), 0);
        assert_eq!(gauge(&b, SyncState::Nacked), 1);
        let listed = b.list();
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[0].node, None, "no node id sorts first");
        assert_eq!(listed[1].shard.as_deref(), Some("1"));
        drop(one);
        assert_eq!(gauge(&b, SyncState::Nacked), 0);
        assert_eq!(gauge(&b, SyncState::NotSent), 1);
        drop(two);
        assert_eq!(gauge(&b, SyncState::NotSent), 0);
        assert!(b.list().is_empty());
    }

    #[test]
    fn json_names_what_an_operator_reads() {
        let b = board();
        let e = b.join("delta", "10.0.0.1:5", None);
        let mut r = TypeRecord::default();
        r.sent("abc");
        r.nacked("port name clash");
        e.update(typed(&r));
        let v = serde_json::to_value(b.list()).expect("json");
        let t = &v[0]["types"][0];
        assert_eq!(t["typeUrl"], "se");
        assert_eq!(t["state"], "nacked");
        assert_eq!(t["sent"]["version"], "abc");
        assert_eq!(t["nack"]["detail"], "port name clash");
        assert!(t["nack"]["at"].as_f64().expect("seconds") > 1.6e9);
        assert_eq!(v[0]["protocol"], "delta");
    }
}
