//! `/debug/resources`: what is served, quarantined and skipped, one page at a time.
//!
//! At 100k services the whole set as JSON is tens of megabytes, built per request; a curl or a
//! scraper pointed at it would cost the adapter that much at every call. So the answer is a page:
//! `?limit=` resources (default [`DEFAULT_LIMIT`], at most [`MAX_LIMIT`]) from `?offset=`, or
//! only the resource `?name=` (`namespace/name`). The lists that can grow with the registry
//! (quarantined services, virtual IPs in quarantine, problem scopes and each scope's lines, the
//! Kubernetes output's names) hold at most `limit` items too. `total` says how many resources
//! there are, `truncated` whether anything was left out, `next` where the next page of resources
//! is (null on the last one).
//! Every text quoted from elsewhere is cut (`clip`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Query, State};
use axum::Json;
use serde_json::{json, Value};

use super::AdminState;
use crate::status::Status;
use mcp_core::cache::{Entry, Snapshot, Summary};
use mcp_core::clip::{clip, ERROR_TEXT_MAX};
use mcp_core::index::Quarantined;
use mcp_core::vip::QuarantinedVip;

/// Resources per page when `?limit=` is not given: enough to read a small registry whole, small
/// enough (about 100 KiB of JSON) to ask for often.
pub const DEFAULT_LIMIT: usize = 500;

/// The largest page: a larger `?limit=` gets this many.
pub const MAX_LIMIT: usize = 5000;

/// The query string.
#[derive(Debug, Default, serde::Deserialize)]
pub(super) struct DebugQuery {
    limit: Option<usize>,
    offset: Option<usize>,
    name: Option<String>,
}

pub(super) async fn resources(
    State(s): State<AdminState>,
    Query(q): Query<DebugQuery>,
) -> Json<Value> {
    Json(page(&s, &q))
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

/// A virtual IP in quarantine (`--vip-quarantine`): no other service gets it for
/// `remainingSeconds`.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct VipView {
    address: String,
    /// The service that let go of it (the one that may take it back).
    released_by: String,
    remaining_seconds: u64,
}

/// One shard of a `--shards` source.
#[derive(serde::Serialize)]
struct ShardView {
    shard: usize,
    address: String,
    version: Option<String>,
    resources: usize,
}

/// The answer to `q`.
fn page(s: &AdminState, q: &DebugQuery) -> Value {
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT).min(MAX_LIMIT);
    let offset = q.offset.unwrap_or(0);
    let snapshots: Vec<Option<Arc<Snapshot>>> =
        s.snapshots.iter().map(|rx| rx.borrow().clone()).collect();
    let sharded = snapshots.len() > 1;
    let (total, entries) = match &q.name {
        Some(name) => named(&snapshots, name, offset, limit),
        None => window(&snapshots, offset, limit),
    };
    let resources: Vec<Value> = entries
        .iter()
        .filter_map(|(shard, e)| {
            serde_json::to_value(Served {
                name: &e.name,
                version: &e.version,
                shard: sharded.then_some(*shard),
                summary: &e.summary,
            })
            .ok()
        })
        .collect();
    let shown = offset.saturating_add(resources.len());
    let next = (shown < total && limit > 0).then(|| next_page(shown, limit, q.name.as_deref()));
    let mut body = json!({
        "registry": s.registry,
        "source": s.source,
        "version": snapshots.first().and_then(|s| s.as_ref()).map(|s| s.version.clone()).filter(|_| !sharded),
        "resources": resources,
        "total": total,
        "offset": offset,
        "limit": limit,
        "next": next,
    });
    let mut truncated = next.is_some();
    truncated |= status_part(&s.status.lock(), limit, &mut body);
    body["truncated"] = json!(truncated);
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
        body["shards"] = json!(shards);
    }
    body
}

/// Every shard's entries in order, `offset` skipped (whole shards by their length), at most
/// `limit`; and how many there are in all.
fn window(
    snapshots: &[Option<Arc<Snapshot>>],
    offset: usize,
    limit: usize,
) -> (usize, Vec<(usize, Arc<Entry>)>) {
    let total = snapshots.iter().flatten().map(|s| s.len()).sum();
    let mut skip = offset;
    let mut out = Vec::new();
    for (shard, snap) in snapshots.iter().enumerate() {
        let Some(snap) = snap else { continue };
        if skip >= snap.len() {
            skip -= snap.len();
            continue;
        }
        let room = limit - out.len();
        out.extend(
            snap.iter()
                .skip(skip)
                .take(room)
                .map(|e| (shard, e.clone())),
        );
        skip = 0;
        if out.len() == limit {
            break;
        }
    }
    (total, out)
}

/// The resource `name` in each shard that serves it (one, but for a shard move in flight).
fn named(
    snapshots: &[Option<Arc<Snapshot>>],
    name: &str,
    offset: usize,
    limit: usize,
) -> (usize, Vec<(usize, Arc<Entry>)>) {
    let all: Vec<(usize, Arc<Entry>)> = snapshots
        .iter()
        .enumerate()
        .filter_map(|(shard, snap)| Some((shard, snap.as_ref()?.get(name)?.clone())))
        .collect();
    let total = all.len();
    (total, all.into_iter().skip(offset).take(limit).collect())
}

/// `/debug/resources?offset=..&limit=..[&name=..]`.
fn next_page(offset: usize, limit: usize, name: Option<&str>) -> String {
    let mut url = format!("/debug/resources?offset={offset}&limit={limit}");
    if let Some(n) = name {
        url.push_str("&name=");
        url.push_str(&query_escape(n));
    }
    url
}

/// Percent-encodes all but unreserved characters and `/` (service keys are `namespace/name`).
fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The health fields and the capped lists, read under the status lock; whether a list was cut.
fn status_part(st: &Status, limit: usize, body: &mut Value) -> bool {
    body["synced"] = json!(st.synced);
    body["restored"] = json!(st.restored);
    body["healthy"] = json!(st.healthy);
    body["lastError"] = json!(st.last_error);
    body["stalenessSeconds"] = json!(st.staleness_secs());
    let quarantined: Vec<Quarantined> = st
        .quarantine
        .iter()
        .take(limit)
        .map(|q| Quarantined {
            reasons: capped_lines(&q.reasons, limit),
            ..q.clone()
        })
        .collect();
    let mut cut = st.quarantine.len() > limit;
    let problems: BTreeMap<&str, Vec<String>> = st
        .problems
        .iter()
        .take(limit)
        .map(|(scope, lines)| {
            cut |= lines.len() > limit;
            (scope.as_str(), capped_lines(lines, limit))
        })
        .collect();
    cut |= st.problems.len() > limit;
    body["quarantined"] = json!(quarantined);
    body["quarantinedTotal"] = json!(st.quarantine.len());
    // The status is as of the last publish; a quarantine that ended since is left out.
    let now = Instant::now();
    let running: Vec<&QuarantinedVip> =
        st.vip_quarantine.iter().filter(|v| v.until > now).collect();
    cut |= running.len() > limit;
    let vips: Vec<VipView> = running
        .iter()
        .take(limit)
        .map(|v| {
            let left = v.until.saturating_duration_since(now);
            VipView {
                address: v.address.to_string(),
                released_by: clip(&v.released_by.to_string(), ERROR_TEXT_MAX).into_owned(),
                // Rounded up: a quarantine still running never shows 0.
                remaining_seconds: left.as_secs() + u64::from(left.subsec_nanos() > 0),
            }
        })
        .collect();
    body["vipQuarantine"] = json!(vips);
    body["vipQuarantineTotal"] = json!(running.len());
    body["problems"] = json!(problems);
    body["problemsTotal"] = json!(st.problems.len());
    if let Some(o) = &st.output {
        let o = o.lock();
        let (mut json, output_cut) = o.to_json(limit);
        // Whether the output makes /registryz 503, as /registryz decides it, read under the same
        // lock as the rest: a tool that waits for the output's failure reads this field, not the
        // wording of /registryz's line (which leaves out a leader's Lease error, for one).
        if let Some(fields) = json.as_object_mut() {
            fields.insert("failing".into(), json!(o.failing()));
        }
        body["kubeOutput"] = json;
        cut |= output_cut;
    }
    cut
}

/// At most `limit` lines, each cut to [`ERROR_TEXT_MAX`], and a last line saying how many more
/// there are.
fn capped_lines(lines: &[String], limit: usize) -> Vec<String> {
    let mut out: Vec<String> = lines
        .iter()
        .take(limit)
        .map(|l| clip(l, ERROR_TEXT_MAX).into_owned())
        .collect();
    if lines.len() > limit {
        out.push(format!("…[{} more]", lines.len() - limit));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::SharedStatus;
    use mcp_core::index::Index;
    use mcp_core::metrics::Metrics;
    use mcp_core::model::ServiceKey;
    use mcp_core::registry::RegistryEvent;
    use mcp_core::testing::mk_service;
    use std::time::Duration;
    use tokio::sync::watch;

    fn snapshot(names: impl Iterator<Item = String>) -> Arc<Snapshot> {
        let mut idx = Index::new(
            mcp_core::translate::test_config(mcp_core::OnEmpty::Keep, mcp_core::vip::VipCidr::Off),
            Metrics::new("test").expect("metrics"),
        );
        idx.apply(RegistryEvent::Reset(
            names.map(|n| mk_service(&n, 2)).collect(),
        ));
        idx.flush().expect("snapshot")
    }

    fn state(shards: Vec<Arc<Snapshot>>) -> AdminState {
        let addrs = (0..shards.len())
            .map(|i| std::net::SocketAddr::from(([127, 0, 0, 1], 15051 + i as u16)))
            .collect();
        AdminState {
            registry: "fake",
            source: "fake".into(),
            status: SharedStatus::default(),
            snapshots: shards
                .into_iter()
                .map(|s| watch::channel(Some(s)).1)
                .collect(),
            grpc_addrs: addrs,
            metrics: Metrics::new("fake").expect("metrics"),
            sync: crate::testing::sync_board(),
        }
    }

    fn q(limit: Option<usize>, offset: Option<usize>, name: Option<&str>) -> DebugQuery {
        DebugQuery {
            limit,
            offset,
            name: name.map(str::to_string),
        }
    }

    fn names(v: &Value) -> Vec<String> {
        v["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .map(|r| r["name"].as_str().expect("name").to_string())
            .collect()
    }

    #[test]
    fn the_default_answer_is_one_capped_page_with_the_way_to_the_next() {
        let s = state(vec![snapshot((0..1200).map(|i| format!("svc-{i:04}")))]);
        let first = page(&s, &DebugQuery::default());
        assert_eq!(names(&first).len(), DEFAULT_LIMIT);
        assert_eq!(first["total"], 1200);
        assert_eq!(first["truncated"], true);
        assert_eq!(first["next"], "/debug/resources?offset=500&limit=500");
        // Following `next` to the end lists every resource once, in order.
        let mut all = names(&first);
        let mut offset = DEFAULT_LIMIT;
        loop {
            let p = page(&s, &q(Some(DEFAULT_LIMIT), Some(offset), None));
            all.extend(names(&p));
            if p["next"].is_null() {
                assert_eq!(p["truncated"], false, "{}", p["truncated"]);
                break;
            }
            offset += DEFAULT_LIMIT;
        }
        let want: Vec<String> = (0..1200).map(|i| format!("ns/svc-{i:04}")).collect();
        assert_eq!(all, want);
        // A page past the end is empty, not an error.
        let past = page(&s, &q(None, Some(5000), None));
        assert_eq!(names(&past).len(), 0);
        assert!(past["next"].is_null());
        // No more than MAX_LIMIT, whatever is asked.
        assert_eq!(
            page(&s, &q(Some(usize::MAX), None, None))["limit"],
            MAX_LIMIT
        );
    }

    #[test]
    fn pages_run_across_shards_and_name_finds_one() {
        let s = state(vec![
            snapshot((0..3).map(|i| format!("a-{i}"))),
            snapshot((0..4).map(|i| format!("b-{i}"))),
        ]);
        let p = page(&s, &q(Some(3), Some(2), None));
        assert_eq!(names(&p), ["ns/a-2", "ns/b-0", "ns/b-1"]);
        let shards: Vec<u64> = p["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .map(|r| r["shard"].as_u64().expect("shard"))
            .collect();
        assert_eq!(shards, [0, 1, 1]);
        assert_eq!(p["total"], 7);
        assert_eq!(p["next"], "/debug/resources?offset=5&limit=3");
        assert_eq!(p["shards"][1]["resources"], 4);
        let one = page(&s, &q(None, None, Some("ns/b-3")));
        assert_eq!(names(&one), ["ns/b-3"]);
        assert_eq!(one["total"], 1);
        assert_eq!(one["truncated"], false);
        let none = page(&s, &q(None, None, Some("ns/nope")));
        assert_eq!(none["total"], 0);
    }

    #[test]
    fn lists_that_grow_with_the_registry_are_capped_and_texts_cut() {
        let s = state(vec![snapshot(std::iter::once("a".to_string()))]);
        {
            let mut st = s.status.lock();
            st.last_error = Some(mcp_core::clip::clip_error("e".repeat(100_000)));
            st.problems = (0..20)
                .map(|i| (format!("file {i}"), vec!["x".repeat(10_000); 30]))
                .collect();
            st.quarantine = (0..20)
                .map(|i| Quarantined {
                    key: format!("ns/q{i}"),
                    origin: "test".into(),
                    reasons: vec!["bad".into()],
                    serving_last_good: false,
                })
                .collect();
            st.vip_quarantine = (0..20)
                .map(|i| QuarantinedVip {
                    address: std::net::Ipv4Addr::new(242, 1, 0, i + 1),
                    released_by: ServiceKey::namespaced("ns", "n".repeat(10_000)),
                    until: Instant::now() + Duration::from_secs(60),
                })
                .collect();
        }
        let p = page(&s, &q(Some(10), None, None));
        assert_eq!(p["truncated"], true);
        assert!(p["next"].is_null(), "one resource: no next page");
        assert_eq!(p["quarantined"].as_array().map(Vec::len), Some(10));
        assert_eq!(p["quarantinedTotal"], 20);
        let problems = p["problems"].as_object().expect("problems");
        assert_eq!(problems.len(), 10);
        assert_eq!(p["problemsTotal"], 20);
        assert_eq!(p["vipQuarantine"].as_array().map(Vec::len), Some(10));
        assert_eq!(p["vipQuarantineTotal"], 20);
        let lines = problems["file 0"].as_array().expect("lines");
        assert_eq!(lines.len(), 11, "10 lines and the count of the rest");
        assert_eq!(lines[10], "…[20 more]");
        assert!(lines[0].as_str().expect("line").len() < ERROR_TEXT_MAX + 32);
        let last_error = p["lastError"].as_str().expect("lastError");
        assert!(
            last_error.len() < ERROR_TEXT_MAX + 32,
            "{}",
            last_error.len()
        );
        // The whole answer stays small although the status holds 6 MB of problem text.
        assert!(p.to_string().len() < 100_000, "{}", p.to_string().len());
    }

    /// #43 item 9: each virtual IP in quarantine with the service that let go of it and the
    /// seconds left; one that ended since the last publish is not shown.
    #[test]
    fn virtual_ips_in_quarantine_are_shown_while_it_runs() {
        let s = state(vec![snapshot(std::iter::once("a".to_string()))]);
        s.status.lock().vip_quarantine = vec![
            QuarantinedVip {
                address: std::net::Ipv4Addr::new(242, 1, 0, 7),
                released_by: ServiceKey::namespaced("ns", "db"),
                until: Instant::now() + Duration::from_millis(299_500),
            },
            QuarantinedVip {
                address: std::net::Ipv4Addr::new(242, 1, 0, 8),
                released_by: ServiceKey::namespaced("ns", "ended"),
                until: Instant::now(),
            },
        ];
        let p = page(&s, &DebugQuery::default());
        assert_eq!(
            p["vipQuarantine"],
            json!([{"address": "242.1.0.7", "releasedBy": "ns/db", "remainingSeconds": 300}])
        );
        assert_eq!(p["vipQuarantineTotal"], 1);
        assert_eq!(p["truncated"], false);
    }

    /// `kubeOutput.failing` is the output's own verdict (what makes /registryz 503), also for a
    /// leader whose Lease cannot be renewed.
    #[test]
    fn the_output_says_whether_it_fails() {
        let s = state(vec![snapshot(std::iter::once("a".to_string()))]);
        let output = mcp_kube_output::SharedOutputStatus::default();
        s.status.lock().output = Some(output.clone());
        {
            let mut o = output.lock();
            o.leader = true;
            o.lease_looked = true;
            o.in_step = true;
        }
        let p = page(&s, &DebugQuery::default());
        assert_eq!(p["kubeOutput"]["failing"], false, "{p}");
        output.lock().lease_error = Some("connection refused".into());
        let p = page(&s, &DebugQuery::default());
        assert_eq!(p["kubeOutput"]["failing"], true, "{p}");
        assert!(
            output.lock().summary().contains("cannot renew the Lease"),
            "the line says it too"
        );
    }

    #[test]
    fn names_in_next_are_escaped() {
        assert_eq!(
            next_page(1, 1, Some("ns/a b&c")),
            "/debug/resources?offset=1&limit=1&name=ns/a%20b%26c"
        );
    }
}
