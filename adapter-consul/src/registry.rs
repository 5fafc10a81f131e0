//! Watches Consul with a bounded number of connections whatever the number of services.
//!
//! A watch starts with a full list (every service fetched with bounded concurrency) sent as one
//! `Reset`. Then up to `--consul-service-watches` services (64 by default; the ones that
//! changed last) each hold a blocking query of their own ([`own_watch`]): its answer *is* that
//! service's change (an instance added, removed or changed, a check, its node), one request per
//! change, and it explains the catalog's wake-up for the same write ([`unexplained`]). Three more
//! blocking queries ([`crate::watch`]) say when something else changed, and the requests that
//! follow are in proportion to what changed where Consul's answers say what:
//!
//! * a health change names its services (the list of non-passing checks differs): those not
//!   watched are fetched;
//! * a catalog change adds, removes or retags names in the catalog's name -> tags map: the
//!   wanted services it added are fetched at once (and get a watch when there is room), the
//!   retagged ones not watched fetched, the removed ones removed, and a filtered-out service
//!   costs nothing. When the index moved by exactly one (one Raft entry since the last
//!   answer, so no other change can hide in it) that is all;
//! * one entry that moved no name is an instance change: explained when an own query answers
//!   with the same index, swept when none does within [`unexplained::GRACE`];
//! * anything else (several Raft entries between two answers, a node change, a node check)
//!   cannot be pinned on services from what Consul sent: when every service is watched, their
//!   own queries see it and nothing more is read; otherwise a *sweep* asks each service that is not watched for its own
//!   `X-Consul-Index` (an empty answer) and fetches only those whose index moved. Consul offers
//!   no bulk way to learn which services moved, and its agent refuses more than
//!   `limits.http_max_conns_per_client` (200) connections from one address: that is what
//!   bounds the watches (a refused connection shrinks them until the next re-list, so that
//!   all of this adapter's connections together stay within three quarters of the limit it
//!   met).
//!
//! Each fetched service becomes an `Upsert` or `Remove`. Requests are counted by endpoint in
//! `mcp_adapter_registry_requests_total`, open per-service watches in
//! `mcp_adapter_registry_service_watches`.
//!
//! A service that cannot be read is that service's problem: its last good state stays served,
//! the failure is reported on its problems, and it is retried alone with its own backoff
//! (without its watch until it reads again). Only Consul itself failing (the change watches
//! fail, a request cannot connect at all, or every request of a sweep cannot) ends the watch
//! with an error: the core then keeps serving the last good state, marks the source unhealthy,
//! backs off and starts a new watch, which re-lists everything.
//!
//! This module is the registry itself and the loop of one watch: what the change watches say
//! decides what is swept. Which services are read and when is [`sweep`], reading many at once
//! [`fetch`], which services hold their own query [`own_watch`], and what follows from reading
//! one (its events, problems and retries) [`service`].

mod fetch;
mod own_watch;
mod service;
mod sweep;
mod unexplained;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use futures::stream::BoxStream;
use mcp_core::{channel_stream, EventSender, Registry, RegistryError, RegistryEvent, Service};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::client::{CheckState, ConsulClient, NodeState};
use crate::config::{ConsulConfig, MAX_CONCURRENCY};
use crate::convert::ConvertSettings;
use crate::error::ConsulError;
use crate::watch::{self, Kind, Signal};
use mcp_core::filter::NameFilter;
use mcp_core::problems::ProblemLedger;
use own_watch::OwnWatches;
use service::ServiceState;
use sweep::Which;
use unexplained::Unexplained;

/// Why the adapter cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Bad Consul settings.
    #[error(transparent)]
    Consul(#[from] ConsulError),
    /// Bad conversion settings.
    #[error("{0}")]
    Convert(String),
}

/// Consul as a watched registry.
#[derive(Clone, Debug)]
pub struct ConsulRegistry {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    client: ConsulClient,
    settings: ConvertSettings,
    filter: NameFilter,
    concurrency: usize,
    /// Most services with their own blocking query.
    service_watches: usize,
    /// Changes read so far (orders [`ServiceState::changed`]).
    changes: std::sync::atomic::AtomicU64,
    /// Problems reported per service, across watches: a re-list clears those of services
    /// that vanished meanwhile.
    reported: Mutex<ProblemLedger>,
    /// The last good state of every served service, across watches: a service that cannot be
    /// read during a re-list keeps it.
    last_good: Mutex<HashMap<String, Service>>,
}

impl ConsulRegistry {
    /// Builds the registry; the ACL token comes from `CONSUL_HTTP_TOKEN` or `--consul-token-file`.
    pub fn new(cfg: &ConsulConfig) -> Result<Self, ConfigError> {
        let token = std::env::var("CONSUL_HTTP_TOKEN").ok();
        Self::with_token(cfg, token)
    }

    /// Builds the registry with an explicit token (tests).
    pub fn with_token(cfg: &ConsulConfig, token: Option<String>) -> Result<Self, ConfigError> {
        Ok(Self {
            inner: Arc::new(Inner {
                client: ConsulClient::new(cfg, token)?,
                settings: ConvertSettings::new(cfg).map_err(ConfigError::Convert)?,
                filter: cfg.services.filter(),
                concurrency: cfg.concurrency.clamp(1, MAX_CONCURRENCY),
                service_watches: cfg.service_watches,
                changes: Default::default(),
                reported: Default::default(),
                last_good: Default::default(),
            }),
        })
    }
}

impl Registry for ConsulRegistry {
    const NAME: &'static str = "consul";
    const DEFAULT_HOST_SUFFIX: &'static str = "service.consul";
    const DEFAULT_NAMESPACE: &'static str = "consul";
    const DEFAULT_VIP_CIDR: mcp_core::vip::VipCidr =
        mcp_core::vip::VipCidr::range(242, 2, 0, 0, 16);

    fn watch(&self) -> BoxStream<'static, Result<RegistryEvent, RegistryError>> {
        let inner = Arc::clone(&self.inner);
        channel_stream(move |tx| async move { inner.watch(tx).await.map_err(RegistryError::from) })
    }

    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        self.inner.client.stats().collectors()
    }
}

impl Inner {
    fn wanted(&self, name: &str) -> bool {
        self.filter.allows(name)
    }

    async fn watch(self: Arc<Self>, tx: EventSender) -> Result<(), ConsulError> {
        // The change indexes first: whatever changes after them is signalled.
        let checks = self.client.unhealthy_checks(None).await?;
        let mut unhealthy: BTreeSet<CheckState> = checks.value.into_iter().collect();
        let nodes = self.client.nodes(None).await?;
        let mut node_indexes = node_map(nodes.value);
        let catalog = self.client.services(None).await?;
        let mut known = self.relist(&tx, catalog.value.keys()).await?;
        let mut catalog_index = catalog.index;
        let mut names = sorted_tags(catalog.value);

        let (sig_tx, mut signals) = mpsc::channel::<Signal>(16);
        // Dropping the set (when this function returns) stops the watches.
        let mut watches: JoinSet<()> = JoinSet::new();
        for (kind, index) in [
            (Kind::Catalog, catalog.index),
            (Kind::Checks, checks.index),
            (Kind::Nodes, nodes.index),
        ] {
            watches.spawn(watch::run(self.client.clone(), kind, index, sig_tx.clone()));
        }
        let mut own = OwnWatches::new(
            self.service_watches,
            self.concurrency + crate::client::WATCHES,
            self.client.clone(),
            sig_tx,
        );
        own.arm(&known);
        let mut unexplained = Unexplained::default();

        loop {
            let next_retry = known
                .values()
                .filter_map(|k| k.retry.as_ref().map(|r| r.at))
                .min();
            let first = tokio::select! {
                s = signals.recv() => s,
                () = sleep_until(next_retry) => {
                    self.retry(&tx, &mut known).await?;
                    continue;
                }
                () = sleep_until(unexplained.due()) => {
                    tracing::debug!("A catalog change no own query explained; sweeping.");
                    unexplained.clear();
                    let except = BTreeSet::new();
                    self.sweep(&tx, &mut known, Which::Unwatched { except: &except }, &own)
                        .await?;
                    self.rebalance(&tx, &mut known, &mut own).await?;
                    continue;
                }
            };
            let Some(first) = first else {
                return Ok(());
            };
            // Everything that queued meanwhile is covered at once: the services named by what
            // changed (each with the index of the change that named it), the nodes whose
            // services to name, or a sweep of every service without its own query when a
            // change names nothing. A service's own query brings its new state itself.
            let mut pending = vec![first];
            while let Ok(s) = signals.try_recv() {
                pending.push(s);
            }
            let mut everything = false;
            let mut named: BTreeMap<String, u64> = BTreeMap::new();
            let mut touched: BTreeMap<String, u64> = BTreeMap::new();
            let mut lost: Vec<String> = Vec::new();
            let mut refused: Vec<String> = Vec::new();
            for signal in pending {
                match signal {
                    Signal::Failed(e) => return Err(e),
                    Signal::Service {
                        name,
                        generation,
                        answer,
                    } => {
                        // Still what Consul said at that index: it explains the catalog's
                        // wake-up even when it is not applied.
                        unexplained.answered(answer.index);
                        if !own.current(&name, generation) {
                            tracing::debug!(service = %name, index = answer.index, "Dropped an answer of a Consul service's own query given up since.");
                            continue;
                        }
                        if let Some(k) = known.get_mut(&name) {
                            if answer.index != k.index {
                                self.apply(&tx, &name, k, answer)
                                    .await
                                    .map_err(|_| ended())?;
                            }
                        }
                    }
                    Signal::ServiceFailed {
                        name,
                        generation,
                        error,
                    } => {
                        if !own.current(&name, generation) {
                            continue;
                        }
                        own.stop(&name);
                        if let Some(k) = known.get_mut(&name) {
                            self.failed(&tx, &name, k, &error)
                                .await
                                .map_err(|_| ended())?;
                        }
                    }
                    Signal::ServiceLost {
                        name: n,
                        generation,
                        error,
                    } => {
                        if !own.current(&n, generation) {
                            continue;
                        }
                        tracing::debug!(service = %n, %error, "A Consul service's own query was cut.");
                        own.stop(&n);
                        if matches!(error, ConsulError::Refused { .. }) {
                            refused.push(n);
                        } else {
                            // Read once more below: that tells a lost connection from Consul
                            // being down.
                            if let Some(k) = known.get(&n) {
                                name(&mut named, &n, k.index);
                            }
                            lost.push(n);
                        }
                    }
                    Signal::Catalog(c) => {
                        let now = sorted_tags(c.value);
                        let moved = changed_names(&names, &now);
                        self.follow_catalog(&tx, &mut known, now.keys().cloned())
                            .await
                            .map_err(|_| ended())?;
                        for n in moved.iter().filter(|n| known.contains_key(*n)) {
                            // A watched service's own query sees the same change (a retag),
                            // a new one is not watched yet.
                            if !own.contains(n) {
                                name(&mut named, n, c.index);
                            }
                        }
                        // One Raft entry since the last answer, and these names are what it
                        // changed: nothing else can hide in it. (A node deregistration, one
                        // entry for many services, is also a node change: swept below.) One
                        // entry that moved no name changed instances: a service's own query
                        // may explain it ([`unexplained`]).
                        let one_entry = c.index == catalog_index.saturating_add(1);
                        if one_entry && moved.is_empty() {
                            unexplained.catalog(c.index);
                        } else if !one_entry {
                            tracing::debug!(
                                index = c.index,
                                previous = catalog_index,
                                moved = moved.len(),
                                "Consul's catalog changed beyond what its list of services shows."
                            );
                            everything = true;
                            if c.index < catalog_index {
                                known.values_mut().for_each(|k| k.index = 0);
                            }
                        }
                        catalog_index = c.index;
                        names = now;
                    }
                    Signal::Checks {
                        unhealthy: now,
                        index,
                        reset,
                    } => {
                        let now: BTreeSet<CheckState> = now.into_iter().collect();
                        for c in unhealthy.symmetric_difference(&now) {
                            if c.service_name.is_empty() {
                                // A node check: every service of that node.
                                name(&mut touched, &c.node, index);
                            } else if known.contains_key(&c.service_name)
                                && !own.contains(&c.service_name)
                            {
                                name(&mut named, &c.service_name, index);
                            }
                        }
                        unhealthy = now;
                        if reset {
                            everything = true;
                            known.values_mut().for_each(|k| k.index = 0);
                        }
                    }
                    Signal::Nodes {
                        nodes: now,
                        index,
                        reset,
                    } => {
                        let now = node_map(now);
                        for (node, modified) in &node_indexes {
                            match now.get(node) {
                                // Its address or meta changed: its services.
                                Some(m) if m != modified => name(&mut touched, node, index),
                                Some(_) => {}
                                // Gone with its instances, which the watch cannot name.
                                None => everything = true,
                            }
                        }
                        // A new node has no instances yet: they come as catalog changes.
                        node_indexes = now;
                        if reset {
                            everything = true;
                            known.values_mut().for_each(|k| k.index = 0);
                        }
                    }
                }
            }
            if own.cover(&known) {
                // Every service's own query sees whatever else changed.
                everything = false;
                touched.clear();
                unexplained.clear();
            }
            if !everything {
                for (node, index) in &touched {
                    match self.client.node_services(node).await {
                        Ok(services) => {
                            for s in services
                                .iter()
                                .filter(|s| known.contains_key(*s) && !own.contains(s))
                            {
                                name(&mut named, s, *index);
                            }
                        }
                        Err(e) => {
                            tracing::warn!(node = %node, error = %e, "Cannot list a Consul node's services; looking at every service.");
                            everything = true;
                            break;
                        }
                    }
                }
            }
            // The named services first: a registration reaches the sinks after one fetch even
            // when a sweep must follow.
            if !named.is_empty() {
                self.sweep(&tx, &mut known, Which::Named(&named), &own)
                    .await?;
            }
            // Consul answers, so the lost queries lost their connection to something between
            // (a proxy cutting long requests): they get a watch again, a little later.
            for n in &lost {
                if let Some(k) = known.get_mut(n) {
                    k.rewatch_at = Some(Instant::now() + REWATCH_AFTER_LOSS);
                }
            }
            // What the queries stopped for a refusal would have seen next: one read from the
            // last index of each.
            if !refused.is_empty() {
                let mut again = BTreeMap::new();
                for s in own.refused(&refused) {
                    if let Some(k) = known.get(&s).filter(|_| !named.contains_key(&s)) {
                        name(&mut again, &s, k.index);
                    }
                }
                if !again.is_empty() {
                    self.sweep(&tx, &mut known, Which::Named(&again), &own)
                        .await?;
                }
            }
            if everything {
                unexplained.clear();
                // A service the catalog's last answer named was just read at (or past) that
                // answer's index, which is what this sweep looks for.
                let except: BTreeSet<String> = named
                    .iter()
                    .filter(|(_, i)| **i >= catalog_index)
                    .map(|(n, _)| n.clone())
                    .collect();
                self.sweep(&tx, &mut known, Which::Unwatched { except: &except }, &own)
                    .await?;
            }
            self.rebalance(&tx, &mut known, &mut own).await?;
        }
    }

    /// After reads: a service without its own query that changed more recently than one with
    /// takes its place (what the query given up would have seen next: one look at its index),
    /// and free room is filled.
    async fn rebalance(
        &self,
        tx: &EventSender,
        known: &mut HashMap<String, ServiceState>,
        own: &mut OwnWatches,
    ) -> Result<(), ConsulError> {
        let given_up = own.make_room(known);
        if !given_up.is_empty() {
            self.sweep(tx, known, Which::Look(&given_up), own).await?;
        }
        own.arm(known);
        Ok(())
    }
}

/// How long a service whose own query lost its connection goes without one (swept meanwhile):
/// a connection cut at once again and again must not become a loop of reads.
const REWATCH_AFTER_LOSS: std::time::Duration = std::time::Duration::from_secs(1);

/// Records that `key` changed at `index` (the highest index wins).
fn name(map: &mut BTreeMap<String, u64>, key: &str, index: u64) {
    let e = map.entry(key.to_string()).or_insert(index);
    *e = (*e).max(index);
}

/// Node name -> index of its last change.
fn node_map(nodes: Vec<NodeState>) -> BTreeMap<String, u64> {
    nodes
        .into_iter()
        .map(|n| (n.node, n.modify_index))
        .collect()
}

/// The catalog's name -> tags map with each service's tags sorted (Consul's order is not
/// promised), so that two answers compare by content.
fn sorted_tags(mut map: BTreeMap<String, Vec<String>>) -> BTreeMap<String, Vec<String>> {
    map.values_mut().for_each(|t| t.sort_unstable());
    map
}

/// The names whose entry differs between two catalog maps: added, removed or retagged.
fn changed_names(
    before: &BTreeMap<String, Vec<String>>,
    after: &BTreeMap<String, Vec<String>>,
) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = before
        .keys()
        .filter(|n| !after.contains_key(*n))
        .cloned()
        .collect();
    for (name, tags) in after {
        if before.get(name) != Some(tags) {
            out.insert(name.clone());
        }
    }
    out
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn ended() -> ConsulError {
    ConsulError::Config("watch dropped".into())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use clap::Parser;
    use futures::StreamExt;

    use super::*;
    use crate::fake::{one_instance, FakeConsul, Reply};

    #[derive(Parser)]
    struct Args {
        #[command(flatten)]
        consul: ConsulConfig,
    }

    fn config(fake: &FakeConsul, extra: &[&str]) -> ConsulConfig {
        let addr = format!("http://{}", fake.addr);
        let mut args = vec![
            "test",
            "--consul-addr",
            addr.as_str(),
            "--consul-wait",
            "2s",
        ];
        args.extend_from_slice(extra);
        Args::try_parse_from(args).expect("args").consul
    }

    type Events = BoxStream<'static, Result<RegistryEvent, RegistryError>>;

    async fn next(events: &mut Events) -> RegistryEvent {
        match tokio::time::timeout(Duration::from_secs(10), events.next()).await {
            Ok(Some(Ok(e))) => e,
            other => panic!("expected an event, got {other:?}"),
        }
    }

    async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
        let end = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < end, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn a_missing_index_header_is_index_1_and_still_blocks() {
        // A proxy that strips X-Consul-Index: every answer comes without it.
        let fake = FakeConsul::start(|r| {
            let body = match r.path() {
                "/v1/catalog/services" => r#"{"web":[]}"#.to_string(),
                "/v1/health/service/web" => one_instance("web", "10.0.0.1"),
                _ => "[]".to_string(),
            };
            Reply {
                status: 200,
                index: None,
                body,
                after: None,
            }
        })
        .await;
        let registry = ConsulRegistry::with_token(&config(&fake, &[]), None).expect("registry");
        let mut events = registry.watch();
        assert!(matches!(next(&mut events).await, RegistryEvent::Reset(s) if s.len() == 1));
        wait_until("blocking catalog query", || {
            fake.requests_to("/v1/catalog/services").len() >= 2
        })
        .await;
        let watched = &fake.requests_to("/v1/catalog/services")[1];
        assert_eq!(
            watched.param("index").as_deref(),
            Some("1"),
            "no index is index 1, not a non-blocking poll: {watched:?}"
        );
        assert!(watched.param("wait").is_some(), "{watched:?}");
        for path in ["/v1/health/state/any", "/v1/catalog/nodes"] {
            wait_until(path, || fake.requests_to(path).len() >= 2).await;
            assert_eq!(
                fake.requests_to(path)[1].param("index").as_deref(),
                Some("1")
            );
        }
    }

    /// Stale reads are the default for blocking queries and for fetches named by a change
    /// (any server answers, bounded by `max_stale`); such a fetch answered from before the
    /// change is read again from the leader; sweeps read from the leader; `--consul-stale
    /// false` reads everything from the leader. Requests are counted by endpoint.
    #[tokio::test]
    async fn stale_reads_where_safe_and_requests_counted() {
        let fake = FakeConsul::start(|r| match r.param("stale") {
            // A follower a little behind the leader.
            Some(_) => Reply::ok(5, "[]"),
            None => Reply::ok(9, "[]"),
        })
        .await;
        let client = ConsulClient::new(&config(&fake, &[]), None).expect("client");
        client.unhealthy_checks(Some(3)).await.expect("request");
        let sent = &fake.requests()[0];
        assert_eq!(sent.param("stale").as_deref(), Some(""), "{sent:?}");
        assert_eq!(
            sent.param("max_stale").as_deref(),
            Some("5000ms"),
            "{sent:?}"
        );

        assert_eq!(client.health_since("web", 5).await.expect("read").index, 5);
        assert_eq!(fake.requests().len(), 2, "fresh enough: one request");
        assert_eq!(client.health_since("web", 7).await.expect("read").index, 9);
        let sent = fake.requests();
        assert_eq!(sent.len(), 4, "behind the change: read again");
        assert_eq!(
            sent[3].param("stale"),
            None,
            "from the leader: {:?}",
            sent[3]
        );
        client.health_index("web").await.expect("request");
        assert_eq!(
            fake.requests()[4].param("stale"),
            None,
            "sweeps read the leader"
        );
        assert_eq!(client.stats().count(crate::client::HEALTH, "read"), 3);
        assert_eq!(client.stats().count(crate::client::HEALTH_INDEX, "read"), 1);
        assert_eq!(
            client.stats().count("/v1/health/state/any", "watch"),
            1,
            "a blocking query is a watch"
        );

        let leader =
            ConsulClient::new(&config(&fake, &["--consul-stale", "false"]), None).expect("client");
        leader.unhealthy_checks(Some(3)).await.expect("request");
        leader.health_since("web", 9).await.expect("request");
        for sent in &fake.requests()[5..] {
            assert_eq!(sent.param("stale"), None, "{sent:?}");
            assert_eq!(sent.param("max_stale"), None, "{sent:?}");
        }
    }

    #[test]
    fn a_catalog_diff_names_added_removed_and_retagged_services() {
        let map = |e: &[(&str, &[&str])]| -> BTreeMap<String, Vec<String>> {
            e.iter()
                .map(|(n, t)| (n.to_string(), t.iter().map(|t| t.to_string()).collect()))
                .collect()
        };
        let before = sorted_tags(map(&[("a", &["x", "y"]), ("b", &[]), ("c", &["v1"])]));
        let after = sorted_tags(map(&[("a", &["y", "x"]), ("c", &["v2"]), ("d", &[])]));
        let moved: Vec<String> = changed_names(&before, &after).into_iter().collect();
        assert_eq!(moved, ["b", "c", "d"], "tag order is no change");
    }

    #[test]
    fn index_sanity() {
        use crate::client::index_of;
        assert_eq!(index_of(None), 1, "missing");
        assert_eq!(index_of(Some(0)), 1);
        assert_eq!(index_of(Some(-4)), 1);
        assert_eq!(index_of(Some(42)), 42);
    }

    #[tokio::test]
    async fn one_failing_service_is_retried_alone_and_reported_as_its_problem() {
        let broken = Arc::new(AtomicBool::new(true));
        let b = Arc::clone(&broken);
        let fake = FakeConsul::start(move |r| match r.path() {
            "/v1/catalog/services" => Reply::ok(10, r#"{"good":[],"bad":[]}"#),
            "/v1/health/service/good" => Reply::ok(10, &one_instance("good", "10.0.0.1")),
            "/v1/health/service/bad" if b.load(Ordering::SeqCst) => Reply {
                status: 500,
                index: None,
                body: "rpc error: boom".into(),
                after: None,
            },
            "/v1/health/service/bad" => Reply::ok(11, &one_instance("bad", "10.0.0.2")),
            _ => Reply::ok(10, "[]"),
        })
        .await;
        let registry = ConsulRegistry::with_token(&config(&fake, &[]), None).expect("registry");
        let mut events = registry.watch();

        // The failing service is reported on its own scope; the other one is served.
        let mut reset = None;
        let mut problem = None;
        while reset.is_none() || problem.is_none() {
            match next(&mut events).await {
                RegistryEvent::Reset(s) => reset = Some(s),
                RegistryEvent::Problems { scope, problems } => problem = Some((scope, problems)),
                other => panic!("unexpected {other:?}"),
            }
        }
        let served: Vec<String> = reset
            .expect("reset")
            .iter()
            .map(|s| s.key.name.clone())
            .collect();
        assert_eq!(served, ["good"]);
        let (scope, problems) = problem.expect("problem");
        assert_eq!(scope, "consul service bad");
        assert!(
            problems
                .iter()
                .any(|p| p.contains("500") && p.contains("boom")),
            "{problems:?}"
        );

        // It is retried alone: no re-list of everything.
        wait_until("a retry of bad", || {
            fake.requests_to("/v1/health/service/bad").len() >= 3
        })
        .await;
        let lists = fake
            .requests_to("/v1/catalog/services")
            .iter()
            .filter(|r| r.param("index").is_none())
            .count();
        assert_eq!(lists, 1, "the catalog was listed again");
        let good = fake.requests_to("/v1/health/service/good");
        assert_eq!(
            good.iter().filter(|r| r.param("index").is_none()).count(),
            1,
            "good is read once, then only watched: {good:?}"
        );
        assert!(
            fake.requests_to("/v1/health/service/bad")
                .iter()
                .all(|r| r.param("index").is_none()),
            "a failing service has no watch until it reads again"
        );

        // Once it reads again it is served and its problem cleared.
        broken.store(false, Ordering::SeqCst);
        let mut upserted = false;
        let mut cleared = false;
        while !(upserted && cleared) {
            match next(&mut events).await {
                RegistryEvent::Upsert(s) => upserted |= s.key.name == "bad",
                RegistryEvent::Problems { scope, problems } => {
                    cleared |= scope == "consul service bad" && problems.is_empty()
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    /// A service with its own blocking query gets its change from that query's answer alone:
    /// no sweep, no other read.
    #[tokio::test]
    async fn a_watched_service_changes_through_its_own_query() {
        use std::sync::atomic::AtomicU64;
        // The catalog index moves with each instance change, as Consul's does; its list of
        // names does not.
        let index = Arc::new(AtomicU64::new(10));
        let i = Arc::clone(&index);
        let fake = FakeConsul::start(move |r| {
            let now = i.load(Ordering::SeqCst);
            match r.path() {
                // At 12 a service "d" registers (the step that follows the one looked at).
                "/v1/catalog/services" if now >= 12 => {
                    Reply::ok(now, r#"{"a":[],"b":[],"c":[],"d":[]}"#)
                }
                "/v1/catalog/services" => Reply::ok(now, r#"{"a":[],"b":[],"c":[]}"#),
                "/v1/health/service/a" if now > 10 => Reply::ok(11, &one_instance("a", "10.0.0.9")),
                "/v1/health/service/d" => Reply::ok(12, &one_instance("d", "10.0.0.4")),
                p if p.starts_with("/v1/health/service/") => {
                    let name = &p["/v1/health/service/".len()..];
                    Reply::ok(10, &one_instance(name, "10.0.0.1"))
                }
                _ => Reply::ok(10, "[]"),
            }
        })
        .await;
        let registry = ConsulRegistry::with_token(&config(&fake, &[]), None).expect("registry");
        let mut events = registry.watch();
        assert!(matches!(next(&mut events).await, RegistryEvent::Reset(s) if s.len() == 3));
        wait_until("three own watches", || {
            ["a", "b", "c"].iter().all(|n| fake.own_queries(n) > 0)
        })
        .await;
        assert_eq!(
            registry
                .inner
                .client
                .stats()
                .count(crate::client::HEALTH, "read"),
            3
        );

        index.store(11, Ordering::SeqCst);
        match next(&mut events).await {
            RegistryEvent::Upsert(s) => {
                assert_eq!(s.key.name, "a");
                assert_eq!(s.endpoints[0].address, "10.0.0.9");
            }
            other => panic!("unexpected {other:?}"),
        }
        // The catalog's wake-up names nothing and every service is watched: nothing is read.
        // Once the catalog's watch asks from 11, that wake-up is queued for the watch loop;
        // a registration after it is handled after it, and `d`'s own query is the last thing
        // the loop does for the registration: by then whatever the wake-up caused was done.
        wait_until("the catalog's wake-up for 11", || {
            fake.requests_to("/v1/catalog/services")
                .iter()
                .any(|r| r.param("index").as_deref() == Some("11"))
        })
        .await;
        index.store(12, Ordering::SeqCst);
        match next(&mut events).await {
            RegistryEvent::Upsert(s) => assert_eq!(s.key.name, "d"),
            other => panic!("unexpected {other:?}"),
        }
        wait_until("d's own query", || fake.own_queries("d") > 0).await;
        for n in ["a", "b", "c"] {
            let reads = fake
                .requests_to(&format!("/v1/health/service/{n}"))
                .into_iter()
                .filter(|r| r.param("index").is_none())
                .count();
            assert_eq!(reads, 1, "no fetch of {n}");
        }
        let stats = registry.inner.client.stats();
        assert_eq!(
            stats.count(crate::client::HEALTH, "read"),
            4,
            "a, b and c once each, then d"
        );
        assert_eq!(
            stats.count(crate::client::HEALTH_INDEX, "read"),
            0,
            "no sweep"
        );
    }

    /// With room for one watch, the other services are swept when the catalog changes beyond
    /// its names; a 429 on a watch gives its slot up for good, and that service is read once.
    ///
    /// On paused time: the clock moves only when every task waits, so "no second sweep within
    /// three grace periods" is exact whatever the machine's load.
    #[tokio::test(start_paused = true)]
    async fn services_beyond_the_budget_are_swept_and_a_429_shrinks_it() {
        use std::sync::atomic::AtomicU64;
        let index = Arc::new(AtomicU64::new(10));
        let refuse = Arc::new(AtomicBool::new(false));
        let (i, no) = (Arc::clone(&index), Arc::clone(&refuse));
        let fake = FakeConsul::start(move |r| {
            let now = i.load(Ordering::SeqCst);
            let watch = r.param("index").is_some();
            // Services registered later, each at its own index: the steps after the one
            // looked at.
            let later = [("d", 13), ("e", 14)];
            match r.path() {
                "/v1/catalog/services" => {
                    let mut names = vec!["a", "b", "c"];
                    names.extend(later.iter().filter(|(_, at)| now >= *at).map(|(n, _)| *n));
                    let body: serde_json::Map<String, serde_json::Value> = names
                        .into_iter()
                        .map(|n| (n.to_string(), serde_json::json!([])))
                        .collect();
                    Reply::ok(now, &serde_json::Value::Object(body).to_string())
                }
                // Consul's agent out of connections for this address.
                _ if watch
                    && no.load(Ordering::SeqCst)
                    && r.path().starts_with("/v1/health/service/") =>
                {
                    Reply {
                        status: 429,
                        index: None,
                        body: "Your IP is issuing too many concurrent connections".into(),
                        after: None,
                    }
                }
                p if p.starts_with("/v1/health/service/") => {
                    let name = &p["/v1/health/service/".len()..];
                    let at = later
                        .iter()
                        .find(|(n, _)| *n == name)
                        .map_or(10, |(_, at)| *at);
                    Reply::ok(at, &one_instance(name, "10.0.0.1"))
                }
                _ => Reply::ok(10, "[]"),
            }
        })
        .await;
        let cfg = config(&fake, &["--consul-service-watches", "1"]);
        let registry = ConsulRegistry::with_token(&cfg, None).expect("registry");
        let mut events = registry.watch();
        assert!(matches!(next(&mut events).await, RegistryEvent::Reset(s) if s.len() == 3));
        let watched = || -> Vec<&str> {
            ["a", "b", "c"]
                .into_iter()
                .filter(|n| fake.own_queries(n) > 0)
                .collect()
        };
        wait_until("one own watch", || watched().len() == 1).await;
        let stats = registry.inner.client.stats().clone();
        // An instance change: the two unwatched services are swept.
        index.store(11, Ordering::SeqCst);
        wait_until("a sweep of two", || {
            stats.count(crate::client::HEALTH_INDEX, "read") == 2
        })
        .await;
        let refused = watched();
        assert_eq!(refused.len(), 1, "still one watch");
        // Consul refuses the watch's next query: no more watches, the others stay swept.
        let metrics = prometheus::Registry::new();
        for c in registry.collectors() {
            metrics.register(c).expect("register");
        }
        let gauge = || {
            metrics
                .gather()
                .into_iter()
                .find(|f| f.name() == "mcp_adapter_registry_service_watches")
                .map(|f| f.get_metric()[0].get_gauge().get_value())
        };
        assert_eq!(gauge(), Some(1.0));
        refuse.store(true, Ordering::SeqCst);
        wait_until("the budget shrunk", || gauge() == Some(0.0)).await;
        // The service refused is read once (what its query would have seen next).
        match next(&mut events).await {
            RegistryEvent::Upsert(s) => assert_eq!(s.key.name, refused[0]),
            other => panic!("unexpected {other:?}"),
        }
        // The refusal alone (no catalog change) sweeps nothing.
        let swept = stats.count(crate::client::HEALTH_INDEX, "read");
        assert_eq!(swept, 2, "the sweep of two only");
        let watches = stats.count(crate::client::HEALTH, "watch");
        index.store(12, Ordering::SeqCst);
        wait_until("a sweep of all three", || {
            stats.count(crate::client::HEALTH_INDEX, "read") >= swept + 3
        })
        .await;
        tokio::time::sleep(unexplained::GRACE * 3).await;
        assert_eq!(
            stats.count(crate::client::HEALTH_INDEX, "read"),
            swept + 3,
            "one sweep"
        );
        // Two registrations, each handled after the one before: `e`'s comes once the loop is
        // done with `d`'s, which would have given `d` the watch its change earned had the
        // budget room for it. Names cost no sweep.
        for (name, at) in [("d", 13), ("e", 14)] {
            index.store(at, Ordering::SeqCst);
            match next(&mut events).await {
                RegistryEvent::Upsert(s) => assert_eq!(s.key.name, name),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(fake.own_queries("d"), 0, "d has no watch");
        assert_eq!(
            stats.count(crate::client::HEALTH, "watch"),
            watches,
            "no new watch"
        );
        assert_eq!(
            stats.count(crate::client::HEALTH_INDEX, "read"),
            swept + 3,
            "still the one sweep"
        );
    }

    /// With room for one own query, a service without one that changes takes it from the one
    /// that changed least recently (whose index is then looked at once); its next change comes
    /// through its own query, with no fetch, and explains the catalog's wake-up: no sweep.
    ///
    /// On paused time: the clock moves only when every task waits, so three grace periods
    /// after the wake-up is queued are three grace periods of the watch loop's own clock,
    /// whatever the machine's load.
    #[tokio::test(start_paused = true)]
    async fn the_services_that_change_get_the_own_queries() {
        use std::collections::HashMap as Map;
        let indexes: Arc<Mutex<Map<String, u64>>> = Arc::new(Mutex::new(
            [("catalog", 10), ("a", 10), ("b", 10), ("c", 10)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        ));
        let i = Arc::clone(&indexes);
        let fake = FakeConsul::start(move |r| {
            let now = i.lock().expect("lock").clone();
            match r.path() {
                "/v1/catalog/services" => Reply::ok(now["catalog"], r#"{"a":[],"b":[],"c":[]}"#),
                p if p.starts_with("/v1/health/service/") => {
                    let name = &p["/v1/health/service/".len()..];
                    let ip = format!("10.0.0.{}", now[name]);
                    Reply::ok(now[name], &one_instance(name, &ip))
                }
                _ => Reply::ok(10, "[]"),
            }
        })
        .await;
        let cfg = config(&fake, &["--consul-service-watches", "1"]);
        let registry = ConsulRegistry::with_token(&cfg, None).expect("registry");
        let mut events = registry.watch();
        assert!(matches!(next(&mut events).await, RegistryEvent::Reset(s) if s.len() == 3));
        let queries = |name: &str| fake.own_queries(name);
        wait_until("one own query", || {
            ["a", "b", "c"].iter().map(|n| queries(n)).sum::<usize>() == 1
        })
        .await;
        let watched = ["a", "b", "c"]
            .into_iter()
            .find(|n| queries(n) == 1)
            .expect("watched");
        let hot = if watched == "a" { "b" } else { "a" };
        let stats = registry.inner.client.stats().clone();
        let change = |n: &str, to: u64| {
            let mut m = indexes.lock().expect("lock");
            m.insert(n.to_string(), to);
            m.insert("catalog".into(), to);
        };
        // `hot` changes: swept, fetched, and it takes the own query.
        change(hot, 11);
        match next(&mut events).await {
            RegistryEvent::Upsert(s) => assert_eq!(s.key.name, hot),
            other => panic!("unexpected {other:?}"),
        }
        wait_until("hot's own query", || queries(hot) == 1).await;
        let fetches = stats.count(crate::client::HEALTH, "read");
        let swept = stats.count(crate::client::HEALTH_INDEX, "read");
        let given_up = queries(watched);
        let looks = fake
            .requests_to(&format!("/v1/health/service/{watched}"))
            .iter()
            .filter(|r| r.param("filter").is_some())
            .count();
        assert_eq!(looks, 1, "the query given up: one look at its index");
        // Its next change: through its own query, no fetch.
        change(hot, 12);
        match next(&mut events).await {
            RegistryEvent::Upsert(s) => {
                assert_eq!(s.key.name, hot);
                assert_eq!(s.endpoints[0].address, "10.0.0.12");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(
            stats.count(crate::client::HEALTH, "read"),
            fetches,
            "no fetch"
        );
        // The catalog's wake-up for the same index is explained by that answer: no sweep.
        // Once the catalog's watch asks from 12 the wake-up is queued for the watch loop.
        wait_until("the catalog's wake-up for 12", || {
            fake.requests_to("/v1/catalog/services")
                .iter()
                .any(|r| r.param("index").as_deref() == Some("12"))
        })
        .await;
        tokio::time::sleep(unexplained::GRACE * 3).await;
        assert_eq!(
            stats.count(crate::client::HEALTH_INDEX, "read"),
            swept,
            "no sweep"
        );
        assert_eq!(
            queries(watched),
            given_up,
            "{watched} has no query any more"
        );
        // The third service changes: nothing explains that entry, so both services without
        // an own query are swept once, and `cold` (fetched) takes `hot`'s query, whose index
        // is then looked at once. Exactly three looks: a sweep the wake-up for 12 caused late
        // would add two.
        let cold = ["a", "b", "c"]
            .into_iter()
            .find(|n| *n != watched && *n != hot)
            .expect("cold");
        change(cold, 13);
        match next(&mut events).await {
            RegistryEvent::Upsert(s) => {
                assert_eq!(s.key.name, cold);
                assert_eq!(s.endpoints[0].address, "10.0.0.13");
            }
            other => panic!("unexpected {other:?}"),
        }
        wait_until("cold's own query", || queries(cold) == 1).await;
        assert_eq!(
            stats.count(crate::client::HEALTH_INDEX, "read"),
            swept + 3,
            "one sweep of {watched} and {cold}, one look at {hot}"
        );
    }

    #[tokio::test]
    async fn the_token_never_shows_in_debug_output() {
        let fake = FakeConsul::start(|_| Reply::ok(1, "[]")).await;
        let token = "5ecret-acl-token-value";
        let registry =
            ConsulRegistry::with_token(&config(&fake, &[]), Some(token.into())).expect("registry");
        let client = ConsulClient::new(&config(&fake, &[]), Some(token.into())).expect("client");
        for shown in [
            format!("{registry:?}"),
            format!("{client:?}"),
            format!("{client:#?}"),
        ] {
            assert!(!shown.contains(token), "{shown}");
            assert!(shown.contains("***"), "{shown}");
        }
        // And it is sent.
        client.health_index("web").await.expect("request");
        assert_eq!(fake.requests()[0].token.as_deref(), Some(token));
    }

    /// A proxy in front of Consul answering an error with a whole page: the error quotes its
    /// start and says how much was cut (it ends up on /readyz and /debug/resources).
    #[tokio::test]
    async fn a_huge_error_body_is_quoted_cut() {
        let page = format!("<html>{}</html>", "<p>502 Bad Gateway</p>".repeat(50_000));
        let len = page.len();
        let fake = FakeConsul::start(move |_| Reply {
            status: 502,
            index: None,
            body: page.clone(),
            after: None,
        })
        .await;
        let client = ConsulClient::new(&config(&fake, &[]), None).expect("client");
        let err = client
            .health_index("web")
            .await
            .expect_err("502")
            .to_string();
        assert!(
            err.contains("HTTP 502: <html><p>502 Bad Gateway</p>"),
            "{err}"
        );
        let cut = len - mcp_core::clip::QUOTED_BODY_MAX;
        assert!(err.ends_with(&format!(" …[{cut} bytes cut]")), "{err}");
        assert!(err.len() <= mcp_core::clip::ERROR_TEXT_MAX, "{}", err.len());
    }

    #[tokio::test]
    async fn a_rewritten_token_file_is_used_without_a_restart() {
        let fake = FakeConsul::start(|_| Reply::ok(1, "[]")).await;
        let dir = std::env::temp_dir().join(format!("adapter-consul-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let file = dir.join("token");
        std::fs::write(&file, "first-token\n").expect("write");
        let cfg = config(
            &fake,
            &["--consul-token-file", file.to_str().expect("utf8")],
        );
        let client = ConsulClient::new(&cfg, None).expect("client");
        client.health_index("web").await.expect("request");
        std::fs::write(&file, "the-second-token").expect("write");
        client.health_index("web").await.expect("request");
        let tokens: Vec<Option<String>> = fake.requests().into_iter().map(|r| r.token).collect();
        assert_eq!(
            tokens,
            [Some("first-token".into()), Some("the-second-token".into())]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// #33 item 9: an own query's answer that was queued when its query was given up is not
    /// applied over the newer read made when giving it up (nor over the answers of the query
    /// opened again afterwards). With room for one own query: `w` holds it; `h` changes and is
    /// swept; while `h` is fetched, `w` changes to 11 and its own query answers (the answer
    /// waits in the loop's queue: the fake holds `h`'s fetch until `w`'s next query, sent after
    /// queueing, arrives); `h` then takes the own query, `w`'s is given up and `w` looked at,
    /// by then at 12. The next event must be `h`'s next change, never `w` back at 11.
    #[tokio::test]
    async fn an_answer_queued_before_its_query_was_given_up_is_dropped() {
        use std::collections::HashMap as Map;
        let state: Arc<Mutex<Map<String, u64>>> = Arc::new(Mutex::new(
            [("catalog", 10), ("a", 10), ("b", 10)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        ));
        // The watched service and the other one, once known.
        let roles: Arc<Mutex<Option<(String, String)>>> = Arc::default();
        // Set by the handler when `w`'s own query asks from 11: its answer at 11 is queued.
        let queued = Arc::new(AtomicBool::new(false));
        let (s, q, ro) = (Arc::clone(&state), Arc::clone(&queued), Arc::clone(&roles));
        let fake = FakeConsul::start(move |r| {
            let watch = r.param("index");
            let look = r.param("filter").is_some();
            let path = r.path().to_string();
            let mut held = false;
            let known_roles = ro.lock().expect("lock").clone();
            if let Some((w, h)) = known_roles {
                let (w_path, h_path) = (
                    format!("/v1/health/service/{w}"),
                    format!("/v1/health/service/{h}"),
                );
                if path == w_path && watch.as_deref() == Some("11") {
                    q.store(true, Ordering::SeqCst);
                }
                if path == h_path && watch.is_none() && !look && s.lock().expect("lock")[&w] == 10 {
                    // `h`'s fetch in the sweep: `w` changes now and its own query answers;
                    // this fetch is answered once that answer is queued.
                    s.lock().expect("lock").insert(w.clone(), 11);
                    held = true;
                }
                if path == w_path && look && s.lock().expect("lock")[&w] == 11 {
                    // Looked at when its query is given up: it has moved on again.
                    s.lock().expect("lock").insert(w.clone(), 12);
                }
            }
            let now = s.lock().expect("lock").clone();
            match path.as_str() {
                "/v1/catalog/services" => Reply::ok(now["catalog"], r#"{"a":[],"b":[]}"#),
                p if p.starts_with("/v1/health/service/") => {
                    let name = &p["/v1/health/service/".len()..];
                    let ip = format!("10.0.0.{}", now[name]);
                    let reply = Reply::ok(now[name], &one_instance(name, &ip));
                    if held {
                        reply.after(Arc::clone(&q))
                    } else {
                        reply
                    }
                }
                _ => Reply::ok(10, "[]"),
            }
        })
        .await;
        let cfg = config(&fake, &["--consul-service-watches", "1"]);
        let registry = ConsulRegistry::with_token(&cfg, None).expect("registry");
        let mut events = registry.watch();
        assert!(matches!(next(&mut events).await, RegistryEvent::Reset(s) if s.len() == 2));
        wait_until("one own query", || {
            fake.own_queries("a") + fake.own_queries("b") == 1
        })
        .await;
        let (w, h) = if fake.own_queries("a") == 1 {
            ("a", "b")
        } else {
            ("b", "a")
        };
        *roles.lock().expect("lock") = Some((w.to_string(), h.to_string()));
        let change = |n: &str, to: u64| {
            let mut m = state.lock().expect("lock");
            m.insert(n.to_string(), to);
            m.insert("catalog".into(), to);
        };
        change(h, 11);
        let mut seen = Vec::new();
        let last = (h.to_string(), "10.0.0.13".to_string());
        while seen.last() != Some(&last) {
            match next(&mut events).await {
                RegistryEvent::Upsert(s) => {
                    let at = (s.key.name.clone(), s.endpoints[0].address.clone());
                    if at == (w.to_string(), "10.0.0.12".to_string()) {
                        assert!(
                            queued.load(Ordering::SeqCst),
                            "{w}'s answer at 11 was queued; requests: {:?}",
                            fake.requests()
                        );
                        // `h` changes once more: the next event must be that change.
                        change(h, 13);
                    }
                    seen.push(at);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(
            seen,
            [(h, "10.0.0.11"), (w, "10.0.0.12"), (h, "10.0.0.13")]
                .map(|(n, a)| (n.to_string(), a.to_string())),
            "{w}'s answer at 11, queued before its query was given up, is never served"
        );
    }
}
