//! The output's writer: makes the API server hold the newest served set, one request per object
//! that changed, while this replica leads. `list` says what the API server holds, `plan` what to
//! send, `send` sends it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::stream::{FuturesUnordered, StreamExt};
use kube::api::{Api, DynamicObject};
use kube::Client;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::client::{code_label, service_entries};
use super::limiter::Limiter;
use super::object::{Owner, Stamp};
use super::plan::{Backlog, Desired, Ledger, Plan};
use crate::metrics::OutputMetrics;
use crate::{OwnerConflict, RegistrySynced, SharedOutputStatus};
use mcp_core::cache::Snapshot;
use mcp_core::clip::clip_error;
use mcp_core::retry::Backoff;

/// Between two looks at whether the registry's first sync is done.
const SYNC_POLL: Duration = Duration::from_millis(100);
/// How soon the API server is listed again while another live writer holds objects with this
/// adapter's labels (its objects are taken over soon after it stops, not a resync later).
const CONFLICT_RELIST: Duration = Duration::from_secs(10);

pub(super) struct ObjectWriter {
    pub(super) client: Client,
    pub(super) owner: Owner,
    /// The Lease this process writes under and its fingerprint (put on every object).
    pub(super) stamp: Stamp,
    /// `--output-namespaces` (empty: any).
    pub(super) namespaces: Vec<String>,
    pub(super) limiter: Limiter,
    pub(super) resync: Duration,
    pub(super) snapshots: Vec<watch::Receiver<Option<Arc<Snapshot>>>>,
    /// Each shard's label value.
    pub(super) shard_labels: Vec<Option<String>>,
    pub(super) status: SharedOutputStatus,
    /// Whether the registry has synced once (nothing is written before).
    pub(super) registry_synced: RegistrySynced,
    pub(super) metrics: OutputMetrics,
    pub(super) leader: watch::Receiver<bool>,
    pub(super) shutdown: CancellationToken,
    /// Other Leases as this process last saw them, to judge their holders by change.
    pub(super) leases_seen: crate::list::LeasesSeen,
}

/// A failure that stops this round (the API server is unwell or unreachable); retried with
/// backoff.
#[derive(Debug, thiserror::Error)]
pub(super) enum SyncError {
    #[error("list ServiceEntries{where_}: {source}")]
    List { where_: String, source: kube::Error },
    #[error("{verb} ServiceEntry {name}: {source}")]
    Write {
        verb: &'static str,
        name: String,
        source: kube::Error,
    },
}

enum Wake {
    Changed,
    Shutdown,
}

/// What the leader knows between rounds.
#[derive(Default)]
struct Known {
    ledger: Option<Ledger>,
    owner_conflicts: Vec<OwnerConflict>,
    unreadable: BTreeMap<String, String>,
}

impl ObjectWriter {
    pub(super) async fn run(mut self) {
        let mut known = Known::default();
        let mut backlog = Backlog::default();
        let mut backoff = Backoff::new();
        let mut next_list = Instant::now();
        loop {
            if self.shutdown.is_cancelled() {
                return;
            }
            self.leader.borrow_and_update();
            if !self.leads() || !self.registry_synced() {
                if !self.leads() && known.ledger.take().is_some() {
                    backlog = Backlog::default();
                    self.update_status(|o| {
                        o.leader = false;
                        o.in_step = false;
                        o.pending = 0;
                        o.behind_since = None;
                        o.owner_conflicts.clear();
                    });
                    self.metrics.kube_pending.set(0);
                    self.metrics.kube_lag.set(0.0);
                    self.metrics.kube_unreadable.set(0);
                    self.set_owner_conflicts(&[]);
                }
                // What is served now is re-read when this replica leads: wake for what comes
                // after it.
                for rx in &mut self.snapshots {
                    rx.borrow_and_update();
                }
                if let Wake::Shutdown = self.wait(Some(SYNC_POLL), None).await {
                    return;
                }
                continue;
            }
            self.update_status(|o| o.leader = true);
            if known.ledger.is_none() || Instant::now() >= next_list {
                let first = known.ledger.is_none();
                match self.list(first).await {
                    Ok(listed) => {
                        let old = known.ledger.take().unwrap_or_default();
                        known.ledger = Some(old.relisted(listed.ledger));
                        let every = if listed.owner_conflicts.is_empty() {
                            self.resync
                        } else {
                            self.resync.min(CONFLICT_RELIST)
                        };
                        next_list = Instant::now() + every;
                        self.set_owner_conflicts(&listed.owner_conflicts);
                        known.owner_conflicts = listed.owner_conflicts;
                        known.unreadable = listed.unreadable;
                        // The API server answered: an earlier failure no longer stands.
                        self.update_status(|o| o.last_error = None);
                    }
                    Err(e) => {
                        if let Wake::Shutdown = self.failed(e, &mut backoff).await {
                            return;
                        }
                        continue;
                    }
                }
            }
            let Some(mut ledger) = known.ledger.take() else {
                continue;
            };
            let desired = self.desired();
            let plan = ledger.plan(&desired, |ns| {
                self.allowed(ns) && !known.unreadable.contains_key(ns)
            });
            let pending = plan.actions.len();
            self.report(&ledger, &plan, &known);
            let (ready, next_retry) = backlog.order(plan.actions, Instant::now());
            if ready.is_empty() {
                backoff.synced(Instant::now());
                if pending == 0 {
                    // In step: no failure to write stands.
                    self.update_status(|o| o.last_error = None);
                }
                known.ledger = Some(ledger);
                let until = next_retry.map_or(next_list, |r| r.min(next_list));
                if let Wake::Shutdown = self.wait(None, Some(until)).await {
                    return;
                }
                continue;
            }
            let result = self.execute(&mut ledger, &mut backlog, ready).await;
            known.ledger = Some(ledger);
            match result {
                Err(e) => {
                    if let Wake::Shutdown = self.failed(e, &mut backoff).await {
                        return;
                    }
                }
                Ok(()) => self.update_status(|o| o.last_error = None),
            }
        }
    }

    /// This replica holds the Lease (a closed channel, the Lease task gone, means it does not).
    pub(super) fn leads(&self) -> bool {
        self.leader.has_changed().is_ok() && *self.leader.borrow()
    }

    /// Resolves when this replica no longer leads.
    pub(super) async fn lost_leadership(&self) {
        let mut rx = self.leader.clone();
        while *rx.borrow_and_update() {
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    fn registry_synced(&self) -> bool {
        (self.registry_synced)()
    }

    fn allowed(&self, namespace: &str) -> bool {
        self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace)
    }

    /// The newest served set of every shard, marking it seen.
    fn desired(&mut self) -> Desired {
        let mut desired = Desired::new();
        for (rx, shard) in self.snapshots.iter_mut().zip(&self.shard_labels) {
            let snapshot = rx.borrow_and_update().clone();
            for entry in snapshot.iter().flat_map(|s| s.iter()) {
                desired.insert(entry.name.clone(), (entry.clone(), shard.clone()));
            }
        }
        desired
    }

    /// Waits for a new snapshot, a leadership change, `poll` or `until`.
    async fn wait(&mut self, poll: Option<Duration>, until: Option<Instant>) -> Wake {
        let mut changes = self
            .snapshots
            .iter_mut()
            .map(|rx| Box::pin(async move { rx.changed().await.is_ok() }))
            .collect::<FuturesUnordered<_>>();
        let poll = async {
            match poll {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        let until = async {
            match until {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        // A closed leadership channel never wakes this (it would spin): not leading is then
        // re-read at the next poll or change.
        let leader = async {
            if self.leader.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            _ = self.shutdown.cancelled() => Wake::Shutdown,
            _ = leader => Wake::Changed,
            Some(true) = changes.next() => Wake::Changed,
            _ = poll => Wake::Changed,
            _ = until => Wake::Changed,
        }
    }

    async fn failed(&mut self, e: SyncError, backoff: &mut Backoff) -> Wake {
        let text = clip_error(e.to_string());
        tracing::warn!(error = %text, "Kubernetes output: the API server did not take the change; retrying with backoff.");
        self.update_status(|o| o.last_error = Some(text));
        let delay = backoff.failed(Instant::now());
        tokio::select! {
            _ = self.shutdown.cancelled() => Wake::Shutdown,
            _ = tokio::time::sleep(delay) => Wake::Changed,
        }
    }

    pub(super) fn api(&self, namespace: Option<&str>) -> Api<DynamicObject> {
        let resource = service_entries();
        match namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &resource),
            None => Api::all_with(self.client.clone(), &resource),
        }
    }

    pub(super) fn count(&self, verb: &str, result: Result<(), &kube::Error>) {
        self.metrics
            .kube_requests
            .with_label_values(&[verb, &code_label(&result)])
            .inc();
    }

    /// Publishes the other live writers found on objects (a log line when the set changes).
    fn set_owner_conflicts(&self, now: &[OwnerConflict]) {
        let before = self.status.lock().owner_conflicts.clone();
        if before != now {
            for c in now {
                tracing::warn!(other_lease = %c.lease, other_holder = %c.holder, objects = c.objects, lease = %self.stamp.lease, "Kubernetes output: another adapter writes objects with this adapter's labels (same registry, --source-name and shard) under its own Lease; its objects are left alone. Give one of them another --source-name.");
            }
            if now.is_empty() {
                tracing::info!(
                    "Kubernetes output: no other adapter writes this adapter's objects any more."
                );
            }
        }
        self.metrics
            .kube_owner_conflicts
            .with_label_values(&["objects"])
            .set(now.len() as i64);
        self.update_status(|o| o.owner_conflicts = now.to_vec());
    }

    fn report(&self, ledger: &Ledger, plan: &Plan, known: &Known) {
        let pending = plan.actions.len();
        self.metrics.kube_pending.set(pending as i64);
        self.metrics.kube_objects.set(ledger.written.len() as i64);
        self.metrics.kube_conflicts.set(plan.conflicts.len() as i64);
        self.metrics.kube_rejected.set(ledger.rejected.len() as i64);
        self.metrics
            .kube_unreadable
            .set(known.unreadable.len() as i64);
        self.update_status(|o| {
            o.leader = true;
            o.objects = ledger.written.len();
            o.pending = pending;
            o.in_step = pending == 0;
            if pending == 0 {
                o.behind_since = None;
            } else if o.behind_since.is_none() {
                o.behind_since = Some(SystemTime::now());
            }
            o.conflicts = plan.conflicts.clone();
            o.refused = plan.refused.clone();
            o.rejected = ledger.rejected.clone();
            o.unreadable = known.unreadable.clone();
        });
        let lag = self.status.lock().lag_secs();
        self.metrics.kube_lag.set(lag);
    }

    fn update_status(&self, f: impl FnOnce(&mut super::OutputStatus)) {
        f(&mut self.status.lock());
    }
}

#[cfg(test)]
mod tests {
    use http::Method;
    use tokio::task::JoinHandle;

    use super::*;
    use crate::fake_api::FakeApi;
    use mcp_core::testing::mk_entry;

    const SE: &str = "/apis/networking.istio.io/v1/namespaces/ns/serviceentries";

    fn snapshot(entries: &[(&str, &str)]) -> Option<Arc<Snapshot>> {
        Some(Arc::new(Snapshot::new(
            entries.iter().map(|(n, v)| mk_entry(n, v)).collect(),
        )))
    }

    /// The writer over a fake API server, leading, with a synced registry serving `entries`.
    struct Writer {
        status: SharedOutputStatus,
        leader: Option<watch::Sender<bool>>,
        served: watch::Sender<Option<Arc<Snapshot>>>,
        _task: JoinHandle<()>,
    }

    fn writer(api: &FakeApi, entries: &[(&str, &str)]) -> Writer {
        writer_at(api, entries, 1000.0)
    }

    fn writer_at(api: &FakeApi, entries: &[(&str, &str)], qps: f64) -> Writer {
        writer_as(api, entries, qps, None, "ns/mcp-adapter-file")
    }

    /// The writer of one shard layout: `only_shard` (`--shard i/n`'s label, or none: unsharded
    /// or every shard in this process), writing under `lease`; every object fingerprint "f".
    fn writer_as(
        api: &FakeApi,
        entries: &[(&str, &str)],
        qps: f64,
        only_shard: Option<&str>,
        lease: &str,
    ) -> Writer {
        let registry = mcp_core::metrics::Metrics::new("test").expect("metrics");
        let metrics = OutputMetrics::new(&registry).expect("output metrics");
        let status = SharedOutputStatus::default();
        let (served, snapshots) = watch::channel(snapshot(entries));
        let (leader, leader_rx) = watch::channel(true);
        let w = ObjectWriter {
            client: api.client(),
            owner: Owner::new("file", "file", only_shard.map(str::to_string)),
            stamp: Stamp {
                lease: lease.into(),
                config: "f".into(),
            },
            namespaces: vec!["ns".into()],
            limiter: Limiter::new(qps, 1),
            resync: Duration::from_secs(300),
            snapshots: vec![snapshots],
            shard_labels: vec![None],
            status: status.clone(),
            registry_synced: Arc::new(|| true),
            metrics,
            leader: leader_rx,
            shutdown: CancellationToken::new(),
            leases_seen: Default::default(),
        };
        Writer {
            status,
            leader: Some(leader),
            served,
            _task: tokio::spawn(w.run()),
        }
    }

    fn writes_of(api: &FakeApi, name: &str) -> usize {
        let path = format!("{SE}/{name}");
        api.log()
            .iter()
            .filter(|r| r.method == Method::PATCH && r.path == path)
            .count()
    }

    /// The API server answers 500 for one object every time: it is tried three times and
    /// rejected; the others are written at once, and the output ends in step with no error.
    #[tokio::test(start_paused = true)]
    async fn a_5xx_for_one_object_rejects_it_alone() {
        let api = FakeApi::new();
        api.fail("bad", 500);
        let w = writer(&api, &[("ns/aaa", "1"), ("ns/bad", "1"), ("ns/ccc", "1")]);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(api.names(SE), ["aaa", "ccc"]);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(writes_of(&api, "bad"), 3);
        let st = w.status.lock().clone();
        assert!(st.rejected.contains_key("ns/bad"), "{st:?}");
        assert!(st.in_step, "{st:?}");
        assert_eq!(st.last_error, None, "{st:?}");
        assert!(!st.failing(), "{st:?}");
        // Nothing more is sent for it until it changes; then it is tried again.
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(writes_of(&api, "bad"), 3);
        w.served.send_replace(snapshot(&[
            ("ns/aaa", "1"),
            ("ns/bad", "2"),
            ("ns/ccc", "1"),
        ]));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(writes_of(&api, "bad"), 4);
    }

    /// #43 item 2: for a while the API server answers 500 to every write of a ServiceEntry (an
    /// istiod rollout whose validating webhook is down). No object is counted for it: nothing is
    /// rejected, the output says it is failing meanwhile, and once writes go through again every
    /// object is written at once, not at the next resync.
    #[tokio::test(start_paused = true)]
    async fn a_storm_of_5xx_for_every_write_rejects_no_object() {
        let api = FakeApi::new();
        api.fail_writes("serviceentries", Some(500));
        let entries = [("ns/a", "1"), ("ns/b", "1"), ("ns/c", "1"), ("ns/d", "1")];
        let w = writer(&api, &entries);
        tokio::time::sleep(Duration::from_secs(30)).await;
        let st = w.status.lock().clone();
        assert!(st.rejected.is_empty(), "nothing rejected: {st:?}");
        assert!(!st.in_step, "{st:?}");
        assert!(st.last_error.is_some(), "the failure is reported: {st:?}");
        assert!(
            writes_of(&api, "a") >= 2,
            "the round was tried again: {}",
            writes_of(&api, "a")
        );
        api.fail_writes("serviceentries", None);
        // The next round (after its back-off) writes them all.
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(api.names(SE), ["a", "b", "c", "d"]);
        let st = w.status.lock().clone();
        assert!(st.in_step && st.rejected.is_empty(), "{st:?}");
        assert_eq!(st.last_error, None, "{st:?}");
    }

    /// One object refused alone, with nothing else to write in its round: the dry-run probe
    /// shows the API server takes writes, so it is that object's, and it is rejected.
    #[tokio::test(start_paused = true)]
    async fn a_5xx_for_the_only_object_is_told_apart_by_a_probe() {
        let api = FakeApi::new();
        api.fail("bad", 500);
        let w = writer(&api, &[("ns/bad", "1")]);
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(writes_of(&api, "bad"), 3);
        let st = w.status.lock().clone();
        assert!(st.rejected.contains_key("ns/bad"), "{st:?}");
        assert!(!st.failing(), "{st:?}");
        let probes = api
            .log()
            .iter()
            .filter(|r| r.method == Method::POST && r.path == SE)
            .count();
        assert!(probes >= 1, "a probe was sent");
        assert!(api.names(SE).is_empty(), "the probe stored nothing");
    }

    const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/ns/leases";

    /// A Lease `name` held by `holder`, renewed (by its holder's clock) `ago` seconds before
    /// now: written again, it gets a new resourceVersion, as a renewal does.
    fn put_lease(api: &FakeApi, name: &str, holder: &str, ago: i64) {
        let renewed =
            k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(ago);
        api.put_object(
            &format!("{LEASES}/{name}"),
            serde_json::json!({"metadata": {"name": name, "namespace": "ns", "uid": format!("u-{name}")},
                "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                         "renewTime": renewed.to_string()}}),
        );
    }

    /// An object of this adapter (registry and source `file`) written under `lease` with shard
    /// label `shard`, fingerprint "f".
    fn put_written(api: &FakeApi, name: &str, lease: &str, shard: Option<&str>) {
        let mut labels = serde_json::json!({"app.kubernetes.io/managed-by": "mcp-adapter",
            "mcp-adapter/registry": "file", "mcp-adapter/source": "file"});
        if let Some(s) = shard {
            labels["mcp-adapter/shard"] = serde_json::json!(s);
        }
        api.put_object(
            &format!("{SE}/{name}"),
            serde_json::json!({"metadata": {"name": name, "namespace": "ns", "uid": format!("u-{name}"),
                "labels": labels,
                "annotations": {"mcp-adapter/lease": lease, "mcp-adapter/config": "f",
                                "mcp-adapter/version": "1"}}}),
        );
    }

    fn lease_of(api: &FakeApi, name: &str) -> String {
        api.object(&format!("{SE}/{name}"))
            .map(|o| o["metadata"]["annotations"]["mcp-adapter/lease"].clone())
            .and_then(|l| l.as_str().map(str::to_string))
            .unwrap_or_default()
    }

    /// #43 item 3: every change of shard layout. The objects of the layout before, under a
    /// Lease whose holder has stopped, are taken over by the same adapter in the new layout
    /// (within a list or two of the Lease's duration), rewritten under its own Lease; a sibling
    /// shard's are left to it. Before, an object of another Lease was taken over only if its
    /// fingerprint was this process's, and a layout change changes the fingerprint: the objects
    /// were "another adapter's" forever.
    #[tokio::test(start_paused = true)]
    async fn every_shard_layout_change_takes_over_the_objects_of_the_one_before() {
        // (the layout before: its objects and their Lease; the layout after: its label and
        // Lease; which objects it must take over, which it must leave)
        struct Change {
            before: &'static [(&'static str, &'static str, Option<&'static str>)],
            dead_leases: &'static [&'static str],
            after: (Option<&'static str>, &'static str),
            taken: &'static [&'static str],
            left: &'static [&'static str],
        }
        let changes = [
            // One process serving 2 shards -> a process per shard (this one: shard 0).
            Change {
                before: &[
                    ("a", "ns/mcp-adapter-file", Some("0-of-2")),
                    ("b", "ns/mcp-adapter-file", Some("1-of-2")),
                ],
                dead_leases: &["mcp-adapter-file"],
                after: (Some("0-of-2"), "ns/mcp-adapter-file-shard-0-of-2"),
                taken: &["a"],
                left: &["b"],
            },
            // A process per shard -> one process serving both.
            Change {
                before: &[
                    ("a", "ns/mcp-adapter-file-shard-0-of-2", Some("0-of-2")),
                    ("b", "ns/mcp-adapter-file-shard-1-of-2", Some("1-of-2")),
                ],
                dead_leases: &[
                    "mcp-adapter-file-shard-0-of-2",
                    "mcp-adapter-file-shard-1-of-2",
                ],
                after: (None, "ns/mcp-adapter-file"),
                taken: &["a", "b"],
                left: &[],
            },
            // A process per shard -> unsharded (the same Lease name as one process serving
            // every shard: no label).
            Change {
                before: &[("a", "ns/mcp-adapter-file-shard-0-of-2", Some("0-of-2"))],
                dead_leases: &["mcp-adapter-file-shard-0-of-2"],
                after: (None, "ns/mcp-adapter-file"),
                taken: &["a"],
                left: &[],
            },
            // Unsharded -> a process per shard.
            Change {
                before: &[("a", "ns/mcp-adapter-file", None)],
                dead_leases: &["mcp-adapter-file"],
                after: (Some("0-of-2"), "ns/mcp-adapter-file-shard-0-of-2"),
                taken: &["a"],
                left: &[],
            },
        ];
        for (k, c) in changes.iter().enumerate() {
            let api = FakeApi::new();
            for lease in c.dead_leases {
                put_lease(&api, lease, "stopped-replica", 60);
            }
            for (name, lease, shard) in c.before {
                put_written(&api, name, lease, *shard);
            }
            let served: Vec<(String, &str)> =
                c.taken.iter().map(|n| (format!("ns/{n}"), "2")).collect();
            let served: Vec<(&str, &str)> = served.iter().map(|(n, v)| (n.as_str(), *v)).collect();
            let w = writer_as(&api, &served, 1000.0, c.after.0, c.after.1);
            // A Lease seen unchanged for its duration and the grace (30 s) has no holder.
            tokio::time::sleep(Duration::from_secs(90)).await;
            for name in c.taken {
                assert_eq!(
                    lease_of(&api, name),
                    c.after.1,
                    "change {k}: {name} taken over"
                );
            }
            for name in c.left {
                assert_ne!(
                    lease_of(&api, name),
                    c.after.1,
                    "change {k}: {name} left alone"
                );
            }
            let st = w.status.lock().clone();
            assert!(st.owner_conflicts.is_empty(), "change {k}: {st:?}");
            assert!(st.in_step, "change {k}: {st:?}");
        }
    }

    /// #43 item 6: another replica's Lease, renewed all along, but by a machine whose clock is
    /// a minute behind this one's (its `renewTime` always looks a minute old here). Its holder
    /// is alive: its objects are never taken over. Before, liveness was its `renewTime` against
    /// this machine's clock, and they were taken and deleted.
    #[tokio::test(start_paused = true)]
    async fn a_lease_renewed_by_a_skewed_clock_is_alive() {
        let api = FakeApi::new();
        put_lease(&api, "mcp-adapter-file-other", "other-replica", 60);
        put_written(&api, "theirs", "ns/mcp-adapter-file-other", None);
        // This process serves another set (nothing named `theirs`).
        let w = writer(&api, &[("ns/mine", "1")]);
        for _ in 0..30 {
            tokio::time::sleep(Duration::from_secs(5)).await;
            put_lease(&api, "mcp-adapter-file-other", "other-replica", 60);
        }
        assert_eq!(
            lease_of(&api, "theirs"),
            "ns/mcp-adapter-file-other",
            "never taken"
        );
        assert!(
            api.object(&format!("{SE}/theirs")).is_some(),
            "never deleted"
        );
        let st = w.status.lock().clone();
        assert_eq!(
            st.owner_conflicts.len(),
            1,
            "the other writer is reported: {st:?}"
        );
        // It stops renewing: after the Lease's duration and the grace, its objects are this
        // adapter's (the same fingerprint), and deleted as this process does not serve them.
        tokio::time::sleep(Duration::from_secs(90)).await;
        assert!(
            api.object(&format!("{SE}/theirs")).is_none(),
            "taken and deleted"
        );
    }

    /// The Lease task gone (its sender dropped) is not leading: nothing more is written.
    #[tokio::test(start_paused = true)]
    async fn a_closed_leadership_channel_means_not_leading() {
        let api = FakeApi::new();
        let mut w = writer(&api, &[("ns/a", "1")]);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(api.names(SE), ["a"]);
        drop(w.leader.take());
        w.served
            .send_replace(snapshot(&[("ns/a", "1"), ("ns/b", "1")]));
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(api.names(SE), ["a"]);
        assert!(!w.status.lock().leader);
    }

    /// Requests in flight when leadership is lost are dropped, not waited for.
    #[tokio::test(start_paused = true)]
    async fn losing_leadership_drops_requests_in_flight() {
        let api = FakeApi::new();
        let mut w = writer(&api, &[("ns/a", "1")]);
        tokio::time::sleep(Duration::from_secs(1)).await;
        api.stall();
        w.served.send_replace(snapshot(&[("ns/a", "2")]));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let pending = |api: &FakeApi| {
            api.log()
                .into_iter()
                .filter(|r| r.method == Method::PATCH && r.answered.is_none())
                .collect::<Vec<_>>()
        };
        assert_eq!(pending(&api).len(), 1, "the apply of a waits");
        if let Some(l) = &w.leader {
            l.send_replace(false);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let waiting = pending(&api);
        assert!(waiting.iter().all(|r| r.abandoned.is_some()), "{waiting:?}");
        drop(w.leader.take());
    }

    /// Changes on the first ten names (more than go out at once) faster than `--output-qps` lets out: each new snapshot
    /// stops the round, yet the last name and a delete are still written, oldest first.
    #[tokio::test(start_paused = true)]
    async fn churn_on_the_first_names_never_starves_the_last_or_a_delete() {
        let api = FakeApi::new();
        api.put_object(
            &format!("{SE}/zz-gone"),
            serde_json::json!({"metadata": {"name": "zz-gone", "namespace": "ns", "uid": "u-gone",
                "labels": {"app.kubernetes.io/managed-by": "mcp-adapter",
                           "mcp-adapter/registry": "file", "mcp-adapter/source": "file"}}}),
        );
        let names: Vec<String> = (0..30).map(|i| format!("ns/s{i:02}")).collect();
        let set = |round: usize| {
            let entries: Vec<(String, String)> = names
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    (
                        n.clone(),
                        if i < 10 {
                            format!("r{round}")
                        } else {
                            "1".into()
                        },
                    )
                })
                .collect();
            let refs: Vec<(&str, &str)> = entries
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect();
            snapshot(&refs)
        };
        // 10 requests a second; a new snapshot every 100 ms.
        let w = writer_at(&api, &[], 10.0);
        for round in 0..200 {
            w.served.send_replace(set(round));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let written = api.names(SE);
        assert!(written.contains(&"s29".to_string()), "{written:?}");
        assert!(!written.contains(&"zz-gone".to_string()), "{written:?}");
    }
}
