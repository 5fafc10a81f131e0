//! `mcpctl status ADMIN_ADDRESS...`: has every sink got what each adapter serves? One row per
//! sink stream and type, across several adapters, from their `/debug/syncz` (what
//! `istioctl proxy-status` is for proxies; istiod itself says nothing about its config sources).
//!
//! STATUS reads the adapter's own record against the version its shard serves now:
//! - `SYNCED`: the sink acknowledged the version served now;
//! - `STALE`: it acknowledged an older one and nothing newer is in flight (a moment after a
//!   change, or a stream that stopped taking them);
//! - `PENDING`: a response is in flight, not acknowledged yet;
//! - `NACKED`: the sink rejected the last response (the reason is printed below the table);
//! - `NOT SENT`: subscribed, nothing sent (the adapter has not synced its registry yet).
//!
//! SINCE is counted on the adapter's clock (its answer says what time it is there), so clocks
//! that disagree between hosts do not skew it.

use std::fmt::Write as _;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::health::{self, HealthError};

/// Most bytes of a `/debug/syncz` answer read: a few hundred bytes per open stream, and an
/// adapter keeps at most `--max-streams` (1024 by default) of them.
pub const MAX_SYNCZ: u64 = 16 << 20;

/// A version and when (Unix seconds, adapter clock).
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Stamped {
    /// Snapshot version.
    pub version: String,
    /// When.
    pub at: f64,
}

/// A rejected response.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Nack {
    /// The version rejected.
    pub version: String,
    /// The sink's reason.
    pub detail: String,
    /// When.
    pub at: f64,
}

/// One type of one stream.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TypeSync {
    /// Type URL or legacy collection.
    pub type_url: String,
    /// `synced`, `pending`, `nacked` or `not_sent`.
    pub state: String,
    /// Newest version sent.
    pub sent: Option<Stamped>,
    /// Newest version acknowledged.
    pub acked: Option<Stamped>,
    /// Last rejection, until an ACK.
    pub nack: Option<Nack>,
}

/// One sink stream.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Sink {
    /// Node id, if the sink gave one.
    pub node: Option<String>,
    /// Its address.
    pub peer: String,
    /// Protocol.
    pub protocol: String,
    /// Shard, with `--shards`.
    pub shard: Option<String>,
    /// When it connected.
    pub connected: f64,
    /// Its types.
    pub types: Vec<TypeSync>,
}

/// What a shard serves now.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Served {
    /// Shard index (0 without `--shards`).
    pub shard: usize,
    /// Version, `None` before the first sync.
    pub version: Option<String>,
    /// Resources.
    pub resources: usize,
}

/// One adapter's `/debug/syncz`.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Syncz {
    /// Registry type.
    pub registry: String,
    /// Source name.
    pub source: String,
    /// The adapter's clock when it answered (Unix seconds).
    pub now: f64,
    /// Per shard.
    pub served: Vec<Served>,
    /// Open sink streams.
    pub sinks: Vec<Sink>,
}

/// Why an adapter's status could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// Not reached.
    #[error(transparent)]
    Http(#[from] HealthError),
    /// Answered, but not with a status.
    #[error("{addr}/debug/syncz answered {status}: {body}")]
    Status {
        /// Where.
        addr: String,
        /// The HTTP status.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// Not the JSON expected (an adapter older than `/debug/syncz`, or not an adapter).
    #[error("{addr}/debug/syncz: not a sync status: {error}")]
    Json {
        /// Where.
        addr: String,
        /// The parse error.
        error: String,
    },
}

/// `GET /debug/syncz` on `admin` within `timeout`.
pub async fn fetch(admin: &str, timeout: Duration) -> Result<Syncz, StatusError> {
    let answer = health::get(admin, "/debug/syncz", MAX_SYNCZ, timeout).await?;
    if answer.status != 200 {
        return Err(StatusError::Status {
            addr: admin.to_string(),
            status: answer.status,
            body: answer.body.chars().take(200).collect(),
        });
    }
    serde_json::from_str(&answer.body).map_err(|e| StatusError::Json {
        addr: admin.to_string(),
        error: e.to_string(),
    })
}

/// A row's STATUS (see the module's doc).
pub fn status_of(t: &TypeSync, served: Option<&str>) -> &'static str {
    match t.state.as_str() {
        "pending" => "PENDING",
        "nacked" => "NACKED",
        "synced" => match (t.acked.as_ref(), served) {
            (Some(a), Some(v)) if a.version == v => "SYNCED",
            _ => "STALE",
        },
        _ => "NOT SENT",
    }
}

/// `ServiceEntry` types by their last two segments (`v1/ServiceEntry`,
/// `v1alpha3/serviceentries`): short, and still telling the API generations apart.
fn short_type(url: &str) -> String {
    let mut parts = url.rsplit('/');
    match (parts.next(), parts.next()) {
        (Some(kind), Some(version)) => format!("{version}/{kind}"),
        _ => url.to_string(),
    }
}

fn short_version(v: Option<&str>) -> String {
    match v {
        Some(v) if v.len() > 12 => v.chars().take(12).collect(),
        Some(v) => v.to_string(),
        None => "-".into(),
    }
}

/// `1m5s`, `3h2m`, `2d4h`.
pub fn age(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{}s", s / 60, s % 60),
        3600..=86399 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{}h", s / 86400, (s % 86400) / 3600),
    }
}

/// One adapter's answer, or why there is none, under the address it was asked at.
pub type Answer = (String, Result<Syncz, StatusError>);

/// The table, then every NACK's reason; one row per sink stream and type, a row per adapter
/// without sinks, and a row per adapter that could not be read.
pub fn table(answers: &[Answer]) -> String {
    const HEAD: [&str; 11] = [
        "ADAPTER", "REGISTRY", "SHARD", "SINK", "PEER", "PROTOCOL", "TYPE", "SENT", "ACKED",
        "STATUS", "SINCE",
    ];
    let mut rows: Vec<Vec<String>> = vec![HEAD.iter().map(|h| h.to_string()).collect()];
    let mut nacks = Vec::new();
    let mut errors = Vec::new();
    for (addr, answer) in answers {
        let z = match answer {
            Ok(z) => z,
            Err(e) => {
                let mut row = vec![addr.clone(), "?".into()];
                row.extend(std::iter::repeat_n("-".to_string(), 7));
                row.extend(["UNREACHABLE".into(), "-".into()]);
                rows.push(row);
                // Every error names the address it could not read.
                errors.push(e.to_string());
                continue;
            }
        };
        if z.sinks.is_empty() {
            let version = z.served.first().and_then(|s| s.version.as_deref());
            rows.push(vec![
                addr.clone(),
                z.registry.clone(),
                "-".into(),
                "(no sink connected)".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                short_version(version),
                "-".into(),
                "NO SINK".into(),
                "-".into(),
            ]);
            continue;
        }
        for sink in &z.sinks {
            let shard: usize = sink
                .shard
                .as_deref()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            let served = z
                .served
                .iter()
                .find(|s| s.shard == shard)
                .and_then(|s| s.version.as_deref());
            let node = sink.node.clone().unwrap_or_else(|| "-".into());
            for t in &sink.types {
                let status = status_of(t, served);
                let since = match status {
                    "PENDING" => t.sent.as_ref().map(|s| s.at),
                    "NACKED" => t.nack.as_ref().map(|n| n.at),
                    "SYNCED" | "STALE" => t.acked.as_ref().map(|a| a.at),
                    _ => Some(sink.connected),
                };
                if let Some(n) = &t.nack {
                    nacks.push(format!(
                        "{addr} {node} ({}) {}: version {} rejected {} ago: {}",
                        sink.peer,
                        short_type(&t.type_url),
                        short_version(Some(&n.version)),
                        age(z.now - n.at),
                        n.detail
                    ));
                }
                rows.push(vec![
                    addr.clone(),
                    z.registry.clone(),
                    sink.shard.clone().unwrap_or_else(|| "-".into()),
                    node.clone(),
                    sink.peer.clone(),
                    sink.protocol.clone(),
                    short_type(&t.type_url),
                    short_version(t.sent.as_ref().map(|s| s.version.as_str())),
                    short_version(t.acked.as_ref().map(|a| a.version.as_str())),
                    status.into(),
                    since.map_or("-".into(), |at| age(z.now - at)),
                ]);
            }
        }
    }
    let widths: Vec<usize> = (0..HEAD.len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    for n in nacks {
        let _ = writeln!(out, "NACK: {n}");
    }
    for e in errors {
        let _ = writeln!(out, "error: {e}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn syncz() -> Syncz {
        serde_json::from_value(serde_json::json!({
            "registry": "consul", "source": "dc1", "now": 1000.0,
            "served": [{"shard": 0, "version": "v2", "resources": 3}],
            "sinks": [
                {"node": "istiod-0", "peer": "10.0.0.1:4000", "protocol": "xds", "shard": null,
                 "connected": 900.0, "types": [
                    {"typeUrl": "networking.istio.io/v1/ServiceEntry", "state": "synced",
                     "sent": {"version": "v2", "at": 990.0}, "acked": {"version": "v2", "at": 991.0}}]},
                {"node": "istiod-1", "peer": "10.0.0.2:4000", "protocol": "delta", "shard": null,
                 "connected": 900.0, "types": [
                    {"typeUrl": "networking.istio.io/v1/ServiceEntry", "state": "nacked",
                     "sent": {"version": "v2", "at": 990.0}, "acked": {"version": "v1", "at": 950.0},
                     "nack": {"version": "v2", "detail": "port clash", "at": 992.0}}]},
                {"node": null, "peer": "10.0.0.3:4000", "protocol": "mcp", "shard": null,
                 "connected": 900.0, "types": [
                    {"typeUrl": "istio/networking/v1alpha3/serviceentries", "state": "synced",
                     "sent": {"version": "v1", "at": 950.0}, "acked": {"version": "v1", "at": 951.0}}]}
            ]
        }))
        .expect("syncz")
    }

    #[test]
    fn rows_say_synced_nacked_and_stale_against_the_served_version() {
        let out = table(&[("a:1".into(), Ok(syncz()))]);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("ADAPTER"), "{out}");
        assert!(
            lines[1].contains("istiod-0")
                && lines[1].contains("SYNCED")
                && lines[1].ends_with("9s"),
            "{out}"
        );
        assert!(
            lines[2].contains("v1/ServiceEntry")
                && lines[2].contains("NACKED")
                && lines[2].ends_with("8s"),
            "{out}"
        );
        assert!(
            lines[3].contains("v1alpha3/serviceentries") && lines[3].contains("STALE"),
            "acked v1 while v2 is served: {out}"
        );
        assert!(
            out.contains("NACK: a:1 istiod-1 (10.0.0.2:4000) v1/ServiceEntry: version v2 rejected 8s ago: port clash"),
            "{out}"
        );
    }

    #[test]
    fn adapters_without_sinks_or_unreachable_get_a_row_each() {
        let mut empty = syncz();
        empty.sinks.clear();
        let err = StatusError::Status {
            addr: "b:2".into(),
            status: 404,
            body: "not found".into(),
        };
        let out = table(&[("a:1".into(), Ok(empty)), ("b:2".into(), Err(err))]);
        assert!(
            out.contains("(no sink connected)") && out.contains("NO SINK"),
            "{out}"
        );
        assert!(out.contains("UNREACHABLE"), "{out}");
        assert!(out.contains("error: b:2/debug/syncz answered 404"), "{out}");
    }

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(age(5.2), "5s");
        assert_eq!(age(65.0), "1m5s");
        assert_eq!(age(3.0 * 3600.0 + 120.0), "3h2m");
        assert_eq!(age(2.0 * 86400.0 + 4.0 * 3600.0), "2d4h");
        assert_eq!(age(-3.0), "0s", "a clock step back is not negative");
    }
}
