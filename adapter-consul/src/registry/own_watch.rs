//! The services that hold a blocking query of their own (`--consul-service-watches`): which
//! ones, starting and stopping their loops ([`crate::watch::run_service`]), and giving up
//! slots when Consul refuses more connections.
//!
//! A watched service needs nothing else: its own query wakes on anything that changes it (an
//! instance, a check, its node), so the watch loop ([`super`]) leaves it out of sweeps and of
//! the services a change names. Only services beyond the budget are swept. With more services
//! than the budget, the ones that changed last hold the queries ([`OwnWatches::make_room`]).

use std::collections::HashMap;

use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use super::service::ServiceState;
use crate::client::ConsulClient;
use crate::watch::{run_service, Signal};

/// One open own query: its loop, and the number that tells its signals from those of a loop
/// stopped before it (whose last answer may still wait in the queue).
#[derive(Debug)]
struct Open {
    generation: u64,
    handle: AbortHandle,
}

/// The open per-service watches of one registry watch; dropping it stops them all.
#[derive(Debug)]
pub(super) struct OwnWatches {
    /// Most open at once.
    budget: usize,
    /// The other connections this adapter may open at once: the change watches and
    /// `--consul-concurrency`.
    others: usize,
    /// Service name -> its loop.
    open: HashMap<String, Open>,
    /// The generation of the next loop started.
    next_generation: u64,
    client: ConsulClient,
    tx: mpsc::Sender<Signal>,
}

impl OwnWatches {
    pub(super) fn new(
        budget: usize,
        others: usize,
        client: ConsulClient,
        tx: mpsc::Sender<Signal>,
    ) -> Self {
        Self {
            budget,
            others,
            open: HashMap::new(),
            next_generation: 0,
            client,
            tx,
        }
    }

    /// `name` holds its own query.
    pub(super) fn contains(&self, name: &str) -> bool {
        self.open.contains_key(name)
    }

    /// A signal from `name`'s loop of `generation` is from the loop open now. A loop stopped
    /// (given up, refused, failed or pruned) may have queued an answer before it stopped;
    /// whatever stopped it reads the service itself, so that answer is older than what is
    /// served, or about to be, and must not be applied; nor may a failure of the old loop stop
    /// the new one.
    pub(super) fn current(&self, name: &str, generation: u64) -> bool {
        self.open
            .get(name)
            .is_some_and(|o| o.generation == generation)
    }

    /// Every service in `known` holds its own query: nothing needs a sweep. (Stops the loops
    /// of services no longer known first.)
    pub(super) fn cover(&mut self, known: &HashMap<String, ServiceState>) -> bool {
        self.prune(known);
        self.open.len() == known.len()
    }

    /// Stops the loops of services no longer known.
    fn prune(&mut self, known: &HashMap<String, ServiceState>) {
        let before = self.open.len();
        self.open.retain(|name, o| {
            let keep = known.contains_key(name);
            if !keep {
                o.handle.abort();
            }
            keep
        });
        if self.open.len() != before {
            self.client.stats().service_watches(self.open.len());
        }
    }

    /// Stops the loop of `name` (it failed, or is gone).
    pub(super) fn stop(&mut self, name: &str) {
        if let Some(o) = self.open.remove(name) {
            o.handle.abort();
        }
        self.client.stats().service_watches(self.open.len());
    }

    /// Consul refused the queries of `names` a connection: this address is at the agent's
    /// limit, shared with everything else here (fetches, sweeps, other clients). The limit
    /// seen is at most the watches still open plus every other connection this adapter may
    /// hold; from now on all of them together stay within three quarters of it (once for all
    /// the refusals seen at once), so that a burst of fetches never fills it, until the next
    /// re-list. The services whose watch stopped, to be read once more.
    pub(super) fn refused(&mut self, names: &[String]) -> Vec<String> {
        for n in names {
            self.stop(n);
        }
        let seen = self.open.len() + self.others;
        let keep = (seen * 3 / 4).saturating_sub(self.others);
        if self.budget > keep {
            tracing::warn!(
                refused = names.len(),
                watching = keep,
                asked = self.budget,
                "Consul refused connections from this address (limits.http_max_conns_per_client, HTTP 429): watching fewer services, the others are swept on changes. Raise Consul's limit, or lower --consul-service-watches (clients behind one address share the limit)."
            );
            self.budget = keep;
        }
        let mut over: Vec<String> = self.open.keys().skip(self.budget).cloned().collect();
        for n in &over {
            self.stop(n);
        }
        over.extend(names.iter().cloned());
        over
    }

    /// With the budget used, gives up the own queries of the services that changed least
    /// recently, one for each service without a query that changed more recently: churn is
    /// usually a few services (a deployment rolling, an autoscaler), and those should cost
    /// their own answer, not a sweep. [`Self::arm`] then opens theirs. The services given up.
    pub(super) fn make_room(&mut self, known: &HashMap<String, ServiceState>) -> Vec<String> {
        if self.budget == 0 || self.open.len() < self.budget {
            return Vec::new();
        }
        let now = tokio::time::Instant::now();
        let mut newer: Vec<u64> = known
            .iter()
            .filter(|(n, k)| k.changed > 0 && ready(k, now) && !self.open.contains_key(*n))
            .map(|(_, k)| k.changed)
            .collect();
        if newer.is_empty() {
            return Vec::new();
        }
        newer.sort_unstable_by(|a, b| b.cmp(a));
        let mut older: Vec<(u64, String)> = self
            .open
            .keys()
            .filter_map(|n| known.get(n).map(|k| (k.changed, n.clone())))
            .collect();
        older.sort_unstable();
        let given_up: Vec<String> = newer
            .iter()
            .zip(older)
            .take_while(|(new, (old, _))| *new > old)
            .map(|(_, (_, n))| n)
            .collect();
        for n in &given_up {
            self.stop(n);
        }
        given_up
    }

    /// Stops the loops of services no longer known, and opens loops for known services until
    /// the budget is used, the most recently changed first: each from the index of its last
    /// good read. A failing service waits for its retry to read again first, one whose query
    /// lost its connection a moment.
    pub(super) fn arm(&mut self, known: &HashMap<String, ServiceState>) {
        self.prune(known);
        let before = self.open.len();
        if self.open.len() < self.budget {
            let now = tokio::time::Instant::now();
            let mut ready: Vec<(&String, &ServiceState)> = known
                .iter()
                .filter(|(n, k)| ready(k, now) && !self.open.contains_key(*n))
                .collect();
            // The most recently changed first.
            ready.sort_unstable_by_key(|(_, k)| std::cmp::Reverse(k.changed));
            let room = self.budget - self.open.len();
            let start: Vec<(String, u64)> = ready
                .into_iter()
                .take(room)
                .map(|(n, k)| (n.clone(), k.index))
                .collect();
            for (name, index) in start {
                self.next_generation += 1;
                let generation = self.next_generation;
                let task = tokio::spawn(run_service(
                    self.client.clone(),
                    name.clone(),
                    generation,
                    index,
                    self.tx.clone(),
                ));
                let handle = task.abort_handle();
                self.open.insert(name, Open { generation, handle });
            }
        }
        if self.open.len() != before {
            self.client.stats().service_watches(self.open.len());
        }
    }
}

/// A service that may hold its own query at `now`: read at least once, not failing, and not
/// just cut off.
fn ready(k: &ServiceState, now: tokio::time::Instant) -> bool {
    k.retry.is_none() && k.index != 0 && k.rewatch_at.is_none_or(|t| t <= now)
}

impl Drop for OwnWatches {
    fn drop(&mut self) {
        for o in self.open.values() {
            o.handle.abort();
        }
        self.client.stats().service_watches(0);
    }
}
