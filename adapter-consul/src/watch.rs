//! The blocking-query loops that say *that* something changed in Consul, and the pacing rules
//! they follow.
//!
//! Three queries stay open: the catalog's service list (registrations, tags), the checks that are
//! not passing (health changes), and every node with the index of its last change (node
//! addresses). Each answer says what changed when compared with the one before:
//! [`crate::registry`] does that and reads what it names. Besides them, up to
//! `--consul-service-watches` services hold a query of their own ([`run_service`]), whose
//! answer is that service's new state.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::client::{CheckState, ConsulClient, Indexed, NodeState};
use crate::convert::HealthEntry;
use crate::error::ConsulError;

/// Rate limit of one blocking-query loop (Consul's advice): a burst of [`BURST`] queries, then
/// one per [`REFILL`]. An isolated change is seen at once; a Consul that changes all the time
/// is polled every 50 ms instead of spun on.
const BURST: u32 = 3;
const REFILL: Duration = Duration::from_millis(50);

/// Wait before a change watch asks again for a connection Consul refused.
const REFUSED_RETRY: Duration = Duration::from_secs(1);

/// A blocking query cut after it was held at least this long had a working connection: a proxy
/// or load balancer in front of Consul closing connections idle for a while cuts every query
/// of a quiet Consul, again and again, and each is asked again from the same index.
const HELD: Duration = Duration::from_secs(1);

/// Whether a blocking query whose connection was cut ([`ConsulError::Cut`]) is asked again
/// from the same index (which loses nothing: Consul answers at once if the index moved
/// meanwhile) instead of failing: once after a quick cut, always after one held for [`HELD`].
/// Two quick cuts in a row are something wrong with Consul or the way to it.
#[derive(Debug, Default)]
struct Cuts {
    /// The last query was cut quickly.
    quick: bool,
}

impl Cuts {
    /// A query sent at `sent` was cut: ask again?
    fn again(&mut self, sent: tokio::time::Instant) -> bool {
        let quick = sent.elapsed() < HELD;
        let again = !(quick && self.quick);
        self.quick = quick;
        again
    }

    /// A query answered.
    fn answered(&mut self) {
        self.quick = false;
    }
}

/// Token bucket for one loop.
#[derive(Debug)]
pub struct RateLimit {
    tokens: u32,
    last: tokio::time::Instant,
}

impl Default for RateLimit {
    fn default() -> Self {
        Self {
            tokens: BURST,
            last: tokio::time::Instant::now(),
        }
    }
}

impl RateLimit {
    /// Waits until a query may be sent.
    pub async fn acquire(&mut self) {
        let now = tokio::time::Instant::now();
        let earned = (now.duration_since(self.last).as_millis() / REFILL.as_millis()) as u32;
        if earned > 0 {
            self.tokens = (self.tokens + earned).min(BURST);
            self.last = now;
        }
        if self.tokens == 0 {
            tokio::time::sleep_until(self.last + REFILL).await;
            self.last += REFILL;
            self.tokens = 1;
        }
        self.tokens -= 1;
    }
}

/// Consul's index rules for one blocking query: the index to send next and whether the answer
/// may carry a change. An index that went backwards (snapshot restore, a restarted dev agent)
/// resets: 0, raised to 1 by the sanity rule, so the next query returns at once with the
/// current state and a fresh index.
pub fn next_index(previous: u64, returned: u64) -> (u64, bool) {
    let returned = returned.max(1);
    if returned < previous {
        (1, true)
    } else {
        (returned, returned != previous)
    }
}

/// What a change watch reports.
#[derive(Debug)]
pub enum Signal {
    /// The catalog's service list, after it changed.
    Catalog(Indexed<BTreeMap<String, Vec<String>>>),
    /// The checks that are not passing, after the checks changed.
    Checks {
        /// The checks now.
        unhealthy: Vec<CheckState>,
        /// Their index.
        index: u64,
        /// The index went backwards.
        reset: bool,
    },
    /// Every node, after a node changed.
    Nodes {
        /// The nodes now.
        nodes: Vec<NodeState>,
        /// Their index.
        index: u64,
        /// The index went backwards: every per-service index is suspect.
        reset: bool,
    },
    /// A service's own watch answered with a change.
    Service {
        /// The service.
        name: String,
        /// Which of the service's own queries answered ([`run_service`]'s `generation`).
        generation: u64,
        /// Its instances now.
        answer: Indexed<Vec<HealthEntry>>,
    },
    /// A service's own watch failed (Consul answered, but not with this service): the service
    /// is retried alone, unwatched.
    ServiceFailed {
        /// The service.
        name: String,
        /// Which of the service's own queries failed.
        generation: u64,
        /// Why.
        error: ConsulError,
    },
    /// A service's own query was refused a connection ([`ConsulError::Refused`]: too many
    /// from this address) or lost it (Consul may be down: the registry reads the service once
    /// more within the cap on requests in flight, which tells).
    ServiceLost {
        /// The service.
        name: String,
        /// Which of the service's own queries lost its connection.
        generation: u64,
        /// Why.
        error: ConsulError,
    },
    /// The watch failed: Consul is unreachable or refuses us.
    Failed(ConsulError),
}

/// Which index a loop follows.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// `/v1/catalog/services`.
    Catalog,
    /// `/v1/health/state/any`.
    Checks,
    /// `/v1/catalog/nodes`.
    Nodes,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Catalog => "catalog",
            Kind::Checks => "checks",
            Kind::Nodes => "nodes",
        }
    }
}

/// Follows one index from `index` and reports each change until `tx` closes or a query fails.
pub async fn run(client: ConsulClient, kind: Kind, mut index: u64, tx: mpsc::Sender<Signal>) {
    let mut limit = RateLimit::default();
    let mut cuts = Cuts::default();
    loop {
        limit.acquire().await;
        let sent = tokio::time::Instant::now();
        let answer = match kind {
            Kind::Catalog => client
                .services(Some(index))
                .await
                .map(|c| (c.index, Signal::Catalog(c))),
            Kind::Checks => client.unhealthy_checks(Some(index)).await.map(|c| {
                let signal = Signal::Checks {
                    unhealthy: c.value,
                    index: c.index,
                    reset: c.index < index,
                };
                (c.index, signal)
            }),
            Kind::Nodes => client.nodes(Some(index)).await.map(|n| {
                let signal = Signal::Nodes {
                    nodes: n.value,
                    index: n.index,
                    reset: n.index < index,
                };
                (n.index, signal)
            }),
        };
        let (returned, signal) = match answer {
            Ok(a) => a,
            Err(e @ ConsulError::Refused { .. }) => {
                // Consul is up but out of connections for this address: not a registry
                // failure; wait for one to free up.
                tracing::warn!(watch = kind.name(), error = %e, "Consul refused a change watch a connection; retrying in 1s.");
                tokio::time::sleep(REFUSED_RETRY).await;
                continue;
            }
            Err(e @ ConsulError::Cut { .. }) if cuts.again(sent) => {
                // Not Consul failing (that would end the watch, and the registry would list
                // every service again): its connection was cut while it waited.
                tracing::debug!(watch = kind.name(), index, error = %e, "A Consul change watch's connection was cut; asking again from the same index.");
                continue;
            }
            Err(e) => {
                let _ = tx.send(Signal::Failed(e)).await;
                return;
            }
        };
        cuts.answered();
        tracing::debug!(
            watch = kind.name(),
            index = returned,
            "Consul answered a blocking query."
        );
        let (next, changed) = next_index(index, returned);
        index = next;
        if !changed {
            continue;
        }
        if tx.send(signal).await.is_err() {
            return;
        }
    }
}

/// One service's own blocking query, from `index` (its last fetch): reports each change of
/// its instances until `tx` closes or a query fails, which ends this loop: a refused or lost
/// connection as [`Signal::ServiceLost`], anything else as [`Signal::ServiceFailed`]. Every
/// signal carries `generation`, which tells this loop's answers from those of a loop for the
/// same service that was stopped after it queued one.
pub async fn run_service(
    client: ConsulClient,
    name: String,
    generation: u64,
    mut index: u64,
    tx: mpsc::Sender<Signal>,
) {
    let mut limit = RateLimit::default();
    let mut cuts = Cuts::default();
    loop {
        limit.acquire().await;
        let sent = tokio::time::Instant::now();
        let answer = match client.health_watch(&name, index).await {
            Ok(a) => {
                cuts.answered();
                a
            }
            Err(e @ ConsulError::Cut { .. }) if cuts.again(sent) => {
                tracing::debug!(service = %name, index, error = %e, "A Consul service's own query's connection was cut; asking again from the same index.");
                continue;
            }
            Err(
                error @ (ConsulError::Refused { .. }
                | ConsulError::Unreachable { .. }
                | ConsulError::Cut { .. }),
            ) => {
                let _ = tx
                    .send(Signal::ServiceLost {
                        name,
                        generation,
                        error,
                    })
                    .await;
                return;
            }
            Err(error) => {
                let _ = tx
                    .send(Signal::ServiceFailed {
                        name,
                        generation,
                        error,
                    })
                    .await;
                return;
            }
        };
        let (next, changed) = next_index(index, answer.index);
        index = next;
        if changed
            && tx
                .send(Signal::Service {
                    name: name.clone(),
                    generation,
                    answer,
                })
                .await
                .is_err()
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn rate_limit_allows_a_burst_then_one_per_refill() {
        let mut l = RateLimit::default();
        let t0 = tokio::time::Instant::now();
        for _ in 0..BURST {
            l.acquire().await;
        }
        assert_eq!(t0.elapsed(), Duration::ZERO, "a burst goes at once");
        l.acquire().await;
        assert_eq!(t0.elapsed(), REFILL);
        l.acquire().await;
        assert_eq!(t0.elapsed(), REFILL * 2);
        tokio::time::sleep(REFILL * 10).await;
        let t1 = tokio::time::Instant::now();
        l.acquire().await;
        assert_eq!(t1.elapsed(), Duration::ZERO, "refilled after a quiet spell");
    }

    #[tokio::test(start_paused = true)]
    async fn a_cut_query_is_asked_again_unless_cut_quickly_twice_in_a_row() {
        let mut cuts = Cuts::default();
        let sent = tokio::time::Instant::now();
        tokio::time::advance(HELD).await;
        assert!(cuts.again(sent), "held, then cut: asked again");
        let sent = tokio::time::Instant::now();
        tokio::time::advance(HELD).await;
        assert!(
            cuts.again(sent),
            "held and cut again and again (an idle timeout)"
        );
        let sent = tokio::time::Instant::now();
        assert!(cuts.again(sent), "a quick cut: once more");
        assert!(
            !cuts.again(sent),
            "a second quick cut in a row: the watch fails"
        );
        cuts.answered();
        assert!(
            cuts.again(sent),
            "after an answer, a quick cut is asked again"
        );
    }

    #[test]
    fn index_rules() {
        assert_eq!(next_index(10, 10), (10, false), "a return without a change");
        assert_eq!(next_index(10, 12), (12, true));
        assert_eq!(
            next_index(10, 3),
            (1, true),
            "backwards: reset to 0, which the sanity rule makes 1"
        );
        assert_eq!(next_index(1, 7), (7, true));
        assert_eq!(next_index(1, 0), (1, false), "0 counts as 1: still blocks");
        assert_eq!(next_index(5, 0), (1, true), "0 after 5 is a reset");
    }
}
