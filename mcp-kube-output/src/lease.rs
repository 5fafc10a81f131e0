//! One writer among replicas: a `coordination.k8s.io/v1` Lease, as Kubernetes controllers hold
//! theirs. Every replica serves MCP; only the Lease's holder writes objects. Followers watch the
//! Lease and take over when its holder stops renewing it (expiry is judged by when this replica
//! last saw the Lease change, never by comparing clocks across machines).
//!
//! Every call to the API server is bounded: a leader's by what is left of its renew deadline (so
//! a call that hangs cannot keep it writing past the point where a follower may take over), a
//! follower's by [`FOLLOW_CALL_TIMEOUT`].

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::Client;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::client::status_code;
// On the Lease too: the holder's fingerprint, for the replicas that look at it.
use super::object::ANNOTATION_CONFIG;
use crate::metrics::OutputMetrics;
use crate::SharedOutputStatus;
use mcp_core::clip::clip_error;

/// How long a Lease holds without renewal (client-go's default).
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How often the holder renews and followers look (client-go's retry period).
pub const RETRY_PERIOD: Duration = Duration::from_secs(2);
/// A holder that could not renew for this long stops writing (before the Lease can expire and
/// another replica take over).
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// How long one Lease call may take while this replica does not lead (and for the release at
/// shutdown, after leadership is given up): nothing depends on it but the next look, so a hung
/// call only has to end before it delays that look for long.
pub const FOLLOW_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Which Lease, and who this replica is.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// This replica's holder identity.
    pub identity: String,
    /// What this adapter serves (`OutputConfig::fingerprint`).
    pub fingerprint: String,
}

/// Why a look at the Lease or a write of it failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The API server (or the way to it) answered with an error.
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// The call did not end in time (it was abandoned).
    #[error("{call} of the Lease timed out after {waited:?}")]
    TimedOut {
        /// Which call: get, replace, create.
        call: &'static str,
        /// How long it was given.
        waited: Duration,
    },
}

/// How long the calls of one attempt may take.
#[derive(Clone, Copy, Debug)]
enum Bound {
    /// Every call ends by this instant (a leader's renew deadline).
    Until(Instant),
    /// Each call gets this long from its start (a follower).
    Each(Duration),
}

impl Bound {
    fn until(self, start: Instant) -> Instant {
        match self {
            Bound::Until(t) => t,
            Bound::Each(d) => start + d,
        }
    }
}

/// Runs one API call within `bound`; a call still pending then is dropped (and its connection
/// with it).
async fn bounded<T>(
    bound: Bound,
    call: &'static str,
    fut: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, LeaseError> {
    let start = Instant::now();
    let until = bound.until(start);
    match tokio::time::timeout_at(until, fut).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(LeaseError::TimedOut {
            call,
            waited: until.saturating_duration_since(start),
        }),
    }
}

/// What this replica last saw of the Lease: its resourceVersion and when it changed.
#[derive(Debug, Default)]
struct Observed {
    version: Option<String>,
    since: Option<Instant>,
}

/// What one attempt found.
#[derive(Debug, PartialEq, Eq)]
enum Attempt {
    /// This replica holds the Lease: its write that said so started at `since`.
    Leads {
        /// Start of the successful create or replace (the API server stored it later, so a
        /// follower's expiry clock cannot have started before this).
        since: Instant,
    },
    /// Another replica holds it.
    Follows {
        /// The holder is configured differently: `(holder, its fingerprint)`.
        conflict: Option<(String, String)>,
    },
}

/// Holds or follows the Lease until `shutdown`, publishing whether this replica leads; releases
/// it at shutdown so a follower takes over at once.
pub async fn elect(
    client: Client,
    cfg: LeaseConfig,
    leader: watch::Sender<bool>,
    metrics: OutputMetrics,
    status: SharedOutputStatus,
    shutdown: CancellationToken,
) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let mut observed = Observed::default();
    // While leading: when the last successful renewal started. Leadership ends RENEW_DEADLINE
    // after it, whatever the calls since are doing.
    let mut renewed: Option<Instant> = None;
    let mut conflict = ConflictState::default();
    loop {
        if renewed.is_some_and(|r| Instant::now() >= r + RENEW_DEADLINE) {
            renewed = None;
            publish(&cfg, &leader, &metrics, false);
        }
        let bound = renewed.map_or(Bound::Each(FOLLOW_CALL_TIMEOUT), |r| {
            Bound::Until(r + RENEW_DEADLINE)
        });
        let result = try_acquire_or_renew(&api, &cfg, &mut observed, bound).await;
        status.lock().lease_error = result.as_ref().err().map(|e| clip_error(e.to_string()));
        match result {
            Ok(Attempt::Leads { since }) => {
                renewed = Some(since);
                conflict.set(&cfg, None, &metrics, &status);
            }
            Ok(Attempt::Follows { conflict: found }) => {
                renewed = None;
                let text = found.map(|(holder, theirs)| conflict_text(&cfg, &holder, &theirs));
                conflict.set(&cfg, text, &metrics, &status);
            }
            Err(e) => {
                // A leader keeps leading until its deadline: one failed renewal is no reason to
                // stop writing, and a follower cannot take over before the Lease expires.
                if renewed.is_some_and(|r| Instant::now() >= r + RENEW_DEADLINE) {
                    renewed = None;
                }
                match &e {
                    LeaseError::TimedOut { call, waited } => tracing::warn!(
                        lease = %cfg.name, namespace = %cfg.namespace, call = *call, waited = ?waited,
                        leader = renewed.is_some(),
                        "A call to the output's Lease timed out."
                    ),
                    LeaseError::Api(_) => tracing::warn!(
                        lease = %cfg.name, namespace = %cfg.namespace, error = %e,
                        leader = renewed.is_some(),
                        "Cannot read or renew the output's Lease."
                    ),
                }
            }
        }
        // After the outcome is in the status: a reader never sees "looked at" without it.
        status.lock().lease_looked = true;
        publish(&cfg, &leader, &metrics, renewed.is_some());
        // A leader wakes at its deadline at the latest, so that leadership ends the moment it
        // passes even when the next look would come later.
        let mut wake = Instant::now() + RETRY_PERIOD;
        if let Some(r) = renewed {
            wake = wake.min(r + RENEW_DEADLINE);
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep_until(wake) => {}
        }
    }
    if renewed.is_some() {
        publish(&cfg, &leader, &metrics, false);
        // Leadership is given up before the release, so its deadline no longer matters: the
        // release is a compare-and-swap on the Lease, safe whenever it lands.
        if let Err(e) = release(&api, &cfg, Bound::Each(FOLLOW_CALL_TIMEOUT)).await {
            tracing::warn!(lease = %cfg.name, namespace = %cfg.namespace, error = %e, "Could not release the output's Lease; a follower takes over when it expires.");
        }
    }
}

/// Publishes leadership to the writer and the metric, logging a change.
fn publish(cfg: &LeaseConfig, leader: &watch::Sender<bool>, metrics: &OutputMetrics, leads: bool) {
    if leads != *leader.borrow() {
        tracing::info!(lease = %cfg.name, namespace = %cfg.namespace, identity = %cfg.identity, leader = leads, "Kubernetes output leadership changed.");
    }
    metrics.kube_leader.set(i64::from(leads));
    // Only a change wakes the writer: every wake costs it a plan of the whole served set.
    leader.send_if_modified(|l| std::mem::replace(l, leads) != leads);
}

/// Whether the Lease's holder is configured differently, as last reported (so that a lasting
/// conflict is logged once, not at every look).
#[derive(Debug, Default)]
struct ConflictState(Option<String>);

impl ConflictState {
    fn set(
        &mut self,
        cfg: &LeaseConfig,
        now: Option<String>,
        metrics: &OutputMetrics,
        status: &SharedOutputStatus,
    ) {
        if now != self.0 {
            match &now {
                Some(text) => {
                    tracing::warn!(lease = %cfg.name, namespace = %cfg.namespace, identity = %cfg.identity, "Not writing: {text}")
                }
                None => {
                    tracing::info!(lease = %cfg.name, namespace = %cfg.namespace, identity = %cfg.identity, "The output's Lease is no longer held by a differently configured adapter.")
                }
            }
        }
        metrics
            .kube_owner_conflicts
            .with_label_values(&["lease"])
            .set(i64::from(now.is_some()));
        status.lock().lease_conflict = now.clone();
        self.0 = now;
    }
}

fn conflict_text(cfg: &LeaseConfig, holder: &str, theirs: &str) -> String {
    format!(
        "the Lease {}/{} is held by {holder}, configured as {theirs}, not as this replica ({}): two adapters with the same registry, --source-name and shard share this Lease; give one of them another --source-name (a rolling update that changes the flags shows this until the old replicas stop)",
        cfg.namespace, cfg.name, cfg.fingerprint
    )
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

fn duration_secs() -> i32 {
    LEASE_DURATION.as_secs() as i32
}

/// Marks the Lease as written by this adapter's configuration.
fn stamp(meta: &mut ObjectMeta, cfg: &LeaseConfig) {
    meta.annotations
        .get_or_insert_with(Default::default)
        .insert(ANNOTATION_CONFIG.to_string(), cfg.fingerprint.clone());
}

async fn try_acquire_or_renew(
    api: &Api<Lease>,
    cfg: &LeaseConfig,
    observed: &mut Observed,
    bound: Bound,
) -> Result<Attempt, LeaseError> {
    let Some(mut lease) = bounded(bound, "get", api.get_opt(&cfg.name)).await? else {
        let mut lease = Lease {
            metadata: ObjectMeta {
                name: Some(cfg.name.clone()),
                namespace: Some(cfg.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(cfg.identity.clone()),
                lease_duration_seconds: Some(duration_secs()),
                acquire_time: Some(now()),
                renew_time: Some(now()),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        stamp(&mut lease.metadata, cfg);
        let since = Instant::now();
        let created = bounded(bound, "create", api.create(&PostParams::default(), &lease)).await;
        return lost_race_is_follow(created, since);
    };
    let at = Instant::now();
    if observed.version != lease.metadata.resource_version {
        observed.version = lease.metadata.resource_version.clone();
        observed.since = Some(at);
    }
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder != cfg.identity {
        let held_for = spec
            .lease_duration_seconds
            .map_or(LEASE_DURATION, |s| Duration::from_secs(s.max(1) as u64));
        let expired = observed
            .since
            .is_none_or(|s| at.duration_since(s) >= held_for);
        if !holder.is_empty() && !expired {
            // A Lease without the annotation comes from an older release: no conflict.
            let theirs = lease
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_CONFIG))
                .filter(|f| **f != cfg.fingerprint)
                .cloned();
            return Ok(Attempt::Follows {
                conflict: theirs.map(|f| (holder, f)),
            });
        }
        // Expired: taken over whatever its holder's configuration (how a rolling update that
        // changes the flags completes).
        spec.holder_identity = Some(cfg.identity.clone());
        spec.acquire_time = Some(now());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.renew_time = Some(now());
    spec.lease_duration_seconds = Some(duration_secs());
    stamp(&mut lease.metadata, cfg);
    // The resourceVersion in `lease` makes this a compare-and-swap: two replicas taking an
    // expired Lease at once cannot both win.
    let since = Instant::now();
    let replaced = bounded(
        bound,
        "replace",
        api.replace(&cfg.name, &PostParams::default(), &lease),
    )
    .await;
    lost_race_is_follow(replaced, since)
}

/// A 409 (someone else created or changed the Lease first) means: follow.
fn lost_race_is_follow(
    r: Result<Lease, LeaseError>,
    since: Instant,
) -> Result<Attempt, LeaseError> {
    match r {
        Ok(_) => Ok(Attempt::Leads { since }),
        Err(LeaseError::Api(e)) if status_code(&e) == Some(409) => {
            Ok(Attempt::Follows { conflict: None })
        }
        Err(e) => Err(e),
    }
}

async fn release(api: &Api<Lease>, cfg: &LeaseConfig, bound: Bound) -> Result<(), LeaseError> {
    let Some(mut lease) = bounded(bound, "get", api.get_opt(&cfg.name)).await? else {
        return Ok(());
    };
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    if spec.holder_identity.as_deref() != Some(cfg.identity.as_str()) {
        return Ok(());
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(now());
    bounded(
        bound,
        "replace",
        api.replace(&cfg.name, &PostParams::default(), &lease),
    )
    .await
    .map(|_| ())
}

/// This replica's default identity: `POD_NAME` (or the host name), the pid and a random suffix.
pub fn default_identity() -> String {
    let host = std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .unwrap_or_else(|| "adapter".into());
    format!("{host}-{}-{}", std::process::id(), random_suffix())
}

/// Five random characters: two containers with `hostNetwork` share the host name and both can be
/// pid 1, and two replicas of one identity would both believe they hold the Lease.
fn random_suffix() -> String {
    use std::hash::{BuildHasher, Hasher};
    // The standard library keys `RandomState`s from the system's random source (per process,
    // then a different key for each one made).
    let mut n = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (0..5)
        .map(|_| {
            let c = b"bcdfghjklmnpqrstvwxz2456789"[(n % 27) as usize];
            n /= 27;
            char::from(c)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::{Arc, Mutex};

    use http::Method;
    use serde_json::json;
    use tokio::task::JoinHandle;

    use crate::fake_api::FakeApi;

    const NS: &str = "ns";
    const NAME: &str = "mcp-adapter-file";
    const LEASE_PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/mcp-adapter-file";
    /// Slack for timeouts that wait for something the test expects (virtual time: never slow).
    const SLACK: Duration = Duration::from_millis(100);

    /// One replica's `elect` task and what it publishes.
    struct Replica {
        /// Every change of leadership, with when (seen by a task of its own, so the test can
        /// ask afterwards whether it ever led).
        changes: Arc<Mutex<Vec<(Instant, bool)>>>,
        /// Every notification the writer would have woken for, changed or not.
        wakes: Arc<std::sync::atomic::AtomicUsize>,
        leader: watch::Receiver<bool>,
        status: SharedOutputStatus,
        metrics: OutputMetrics,
        shutdown: CancellationToken,
        task: JoinHandle<()>,
    }

    fn replica(api: &FakeApi, identity: &str, fingerprint: &str) -> Replica {
        let registry = mcp_core::metrics::Metrics::new("test").expect("metrics");
        let metrics = OutputMetrics::new(&registry).expect("output metrics");
        let status = SharedOutputStatus::default();
        let shutdown = CancellationToken::new();
        let (tx, leader) = watch::channel(false);
        let changes = Arc::new(Mutex::new(Vec::new()));
        let (mut rx, seen) = (leader.clone(), changes.clone());
        let wakes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let woken = wakes.clone();
        tokio::spawn(async move {
            let mut last = false;
            while rx.changed().await.is_ok() {
                woken.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let now = *rx.borrow_and_update();
                if now != last {
                    seen.lock().expect("changes").push((Instant::now(), now));
                    last = now;
                }
            }
        });
        let cfg = LeaseConfig {
            namespace: NS.into(),
            name: NAME.into(),
            identity: identity.into(),
            fingerprint: fingerprint.into(),
        };
        let task = tokio::spawn(elect(
            api.client(),
            cfg,
            tx,
            metrics.clone(),
            status.clone(),
            shutdown.clone(),
        ));
        Replica {
            changes,
            wakes,
            leader,
            status,
            metrics,
            shutdown,
            task,
        }
    }

    impl Replica {
        /// Waits until it leads (at most `within`); when it started to.
        async fn until_leads(&mut self, within: Duration) -> Instant {
            tokio::time::timeout(within, self.leader.wait_for(|l| *l))
                .await
                .expect("leads in time")
                .expect("elect runs");
            Instant::now()
        }

        fn led_at(&self) -> Vec<Instant> {
            let changes = self.changes.lock().expect("changes");
            changes
                .iter()
                .filter(|(_, l)| *l)
                .map(|(t, _)| *t)
                .collect()
        }

        fn lost_at(&self) -> Vec<Instant> {
            let changes = self.changes.lock().expect("changes");
            changes
                .iter()
                .filter(|(_, l)| !*l)
                .map(|(t, _)| *t)
                .collect()
        }

        fn conflict_metric(&self) -> i64 {
            self.metrics
                .kube_owner_conflicts
                .with_label_values(&["lease"])
                .get()
        }
    }

    /// When the last write of the Lease naming `holder` that the API server took arrived.
    fn last_write_by(api: &FakeApi, holder: &str) -> Instant {
        api.log()
            .iter()
            .filter(|r| matches!(r.method, Method::PUT | Method::POST))
            .filter(|r| r.path.contains("/leases"))
            .filter(|r| r.answered.is_some_and(|(code, _)| code < 300))
            .filter(|r| {
                r.body
                    .as_ref()
                    .is_some_and(|b| b["spec"]["holderIdentity"] == holder)
            })
            .map(|r| r.arrived)
            .max()
            .unwrap_or_else(|| panic!("no write by {holder}"))
    }

    /// A leader that keeps renewing wakes the writer once, when it starts to lead: not at every
    /// renewal (each wake is a plan of the whole served set).
    #[tokio::test(start_paused = true)]
    async fn a_steady_leader_wakes_the_writer_only_on_a_change() {
        let api = FakeApi::new();
        let mut a = replica(&api, "a", "f1");
        a.until_leads(SLACK).await;
        tokio::time::sleep(LEASE_DURATION * 2).await;
        assert_eq!(a.wakes.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(a.led_at().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_replica_leads_a_second_follows_and_a_release_hands_over_at_once() {
        let api = FakeApi::new();
        let mut a = replica(&api, "a", "f1");
        a.until_leads(SLACK).await;
        let mut b = replica(&api, "b", "f1");
        // Twice the Lease's duration: a holder that renews keeps it.
        tokio::time::sleep(LEASE_DURATION * 2).await;
        assert!(b.led_at().is_empty(), "b led while a renewed");
        assert!(*a.leader.borrow());
        assert_eq!(a.lost_at(), []);
        let lease = api.object(LEASE_PATH).expect("the Lease");
        assert_eq!(lease["spec"]["holderIdentity"], "a");
        assert_eq!(lease["metadata"]["annotations"][ANNOTATION_CONFIG], "f1");
        // The same configuration is no conflict.
        assert_eq!(b.status.lock().lease_conflict, None);
        assert_eq!(b.conflict_metric(), 0);

        a.shutdown.cancel();
        a.task.await.expect("a stops");
        assert!(!*a.leader.borrow());
        let released = Instant::now();
        assert_eq!(
            api.object(LEASE_PATH).expect("the Lease")["spec"]["holderIdentity"],
            serde_json::Value::Null
        );
        // Released: b takes it at its next look, not after an expiry.
        let led = b.until_leads(RETRY_PERIOD + SLACK).await;
        assert!(led - released <= RETRY_PERIOD, "{:?}", led - released);
    }

    /// Until its first look at the Lease, a replica does not claim that another holds it (a
    /// second adapter's /registryz said "following" before it had seen the conflict).
    #[tokio::test(start_paused = true)]
    async fn a_replica_says_following_or_conflict_only_after_its_first_look() {
        let api = FakeApi::new();
        let mut a = replica(&api, "a", "f1");
        a.until_leads(SLACK).await;
        let b = replica(&api, "b", "f1");
        let c = replica(&api, "c", "f2");
        for r in [&b, &c] {
            let summary = r.status.lock().summary();
            assert!(summary.starts_with("kube output: starting"), "{summary}");
            assert!(!r.status.lock().failing());
        }
        tokio::time::sleep(SLACK).await;
        let summary = b.status.lock().summary();
        assert!(summary.starts_with("kube output: following"), "{summary}");
        let summary = c.status.lock().summary();
        assert!(summary.starts_with("kube output: not writing"), "{summary}");
        assert!(c.status.lock().failing());
    }

    #[tokio::test(start_paused = true)]
    async fn a_killed_holder_is_replaced_only_after_the_lease_duration_without_change() {
        let api = FakeApi::new();
        let mut a = replica(&api, "a", "f1");
        a.until_leads(SLACK).await;
        let mut b = replica(&api, "b", "f1");
        tokio::time::sleep(RETRY_PERIOD * 3).await;
        // No release: as when the process is killed.
        a.task.abort();
        let last = last_write_by(&api, "a");
        let led = b
            .until_leads(LEASE_DURATION + RETRY_PERIOD * 2 + SLACK)
            .await;
        assert_eq!(b.led_at(), [led], "b led before");
        // b counts from when it saw the last change (at most one look after it).
        assert!(led >= last + LEASE_DURATION, "{:?}", led - last);
        assert!(
            led <= last + LEASE_DURATION + RETRY_PERIOD * 2,
            "{:?}",
            led - last
        );
        let lease = api.object(LEASE_PATH).expect("the Lease");
        assert_eq!(lease["spec"]["holderIdentity"], "b");
        assert_eq!(lease["spec"]["leaseTransitions"], 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_whose_calls_hang_stops_leading_by_its_renew_deadline() {
        let api = FakeApi::new();
        let mut a = replica(&api, "a", "f1");
        a.until_leads(SLACK).await;
        tokio::time::sleep(RETRY_PERIOD * 3 + SLACK).await;
        api.stall();
        let stalled = Instant::now();
        assert!(*a.leader.borrow());
        tokio::time::timeout(RENEW_DEADLINE + RETRY_PERIOD, a.leader.wait_for(|l| !*l))
            .await
            .expect("a stops leading while its calls hang")
            .expect("elect runs");
        let lost = *a.lost_at().first().expect("a lost leadership");
        let renewed = last_write_by(&api, "a");
        assert!(renewed < stalled);
        assert!(
            lost <= renewed + RENEW_DEADLINE,
            "leading {:?} after its last renewal started",
            lost - renewed
        );
        // A call was pending when leadership ended: sent after the stall, never answered, and
        // not given up before that instant.
        let log = api.log();
        let pending: Vec<_> = log
            .iter()
            .filter(|r| r.arrived >= stalled && r.arrived < lost && r.answered.is_none())
            .collect();
        assert!(!pending.is_empty(), "no call pending: {log:?}");
        for r in &pending {
            assert!(r.abandoned.is_none_or(|t| t >= lost), "{r:?}");
        }
        // The call's timeout is on the status.
        let error = a.status.lock().lease_error.clone().expect("a Lease error");
        assert!(error.contains("timed out"), "{error}");

        // Answering again, it leads again (nobody else took the Lease).
        api.resume();
        a.until_leads(FOLLOW_CALL_TIMEOUT + RETRY_PERIOD + SLACK)
            .await;
        assert_eq!(a.status.lock().lease_error, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_differently_configured_holder_is_a_conflict_until_its_lease_expires() {
        let api = FakeApi::new();
        let mut a = replica(&api, "a", "fa");
        a.until_leads(SLACK).await;
        let mut b = replica(&api, "b", "fb");
        tokio::time::sleep(LEASE_DURATION * 2).await;
        assert!(b.led_at().is_empty(), "b led while a renewed");
        let text = b.status.lock().lease_conflict.clone().expect("a conflict");
        for part in [
            "ns/mcp-adapter-file",
            "held by a",
            "fa",
            "fb",
            "--source-name",
        ] {
            assert!(text.contains(part), "{part:?} not in {text}");
        }
        assert_eq!(b.conflict_metric(), 1);
        assert_eq!(a.status.lock().lease_conflict, None);
        assert_eq!(a.conflict_metric(), 0);

        // a stops renewing (the old replicas of a rolling update going away): b takes the
        // expired Lease whatever its configuration, and the conflict is over.
        a.task.abort();
        let last = last_write_by(&api, "a");
        let led = b
            .until_leads(LEASE_DURATION + RETRY_PERIOD * 2 + SLACK)
            .await;
        assert!(led >= last + LEASE_DURATION, "{:?}", led - last);
        assert_eq!(b.status.lock().lease_conflict, None);
        assert_eq!(b.conflict_metric(), 0);
        let lease = api.object(LEASE_PATH).expect("the Lease");
        assert_eq!(lease["spec"]["holderIdentity"], "b");
        assert_eq!(lease["metadata"]["annotations"][ANNOTATION_CONFIG], "fb");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_without_the_annotation_is_no_conflict() {
        let api = FakeApi::new();
        // Held by an older release, which writes no fingerprint.
        api.put_object(
            LEASE_PATH,
            json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                   "metadata": {"name": NAME, "namespace": NS},
                   "spec": {"holderIdentity": "old", "leaseDurationSeconds": 15}}),
        );
        let mut b = replica(&api, "b", "fb");
        tokio::time::sleep(RETRY_PERIOD * 3).await;
        assert!(b.led_at().is_empty());
        assert_eq!(b.status.lock().lease_conflict, None);
        assert_eq!(b.conflict_metric(), 0);
        b.until_leads(LEASE_DURATION + SLACK).await;
    }

    #[test]
    fn default_identities_of_one_host_and_pid_differ() {
        let (a, b) = (default_identity(), default_identity());
        assert_ne!(a, b);
        let pid = format!("-{}-", std::process::id());
        for id in [&a, &b] {
            let (_, suffix) = id.rsplit_once(&pid).expect("host-pid-suffix");
            assert_eq!(suffix.len(), 5, "{id}");
            assert!(suffix.bytes().all(|c| c.is_ascii_alphanumeric()), "{id}");
        }
    }
}
