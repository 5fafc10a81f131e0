//! The start-up grace of a watch that follows another (`--startup-grace`): a restarted Nacos has
//! lost its ephemeral instances until their clients register them again (a 2.x client does
//! that within seconds of reconnecting), and it answers at once with what it has: the services
//! of the first clients back, and persistent instances. Believed at once, every other service
//! would be served without endpoints, or removed, until its clients return.
//!
//! So per service: one that had endpoints in the state the core holds and that the new watch
//! finds without any (or not at all) keeps its last version until its endpoints are back (a
//! push brings them), or the grace ends; then what the registry says is served. A service that
//! comes back with fewer endpoints is served as it is (its clients are returning), and a
//! service that never had endpoints is never held. The first watch has nothing to hold.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use mcp_core::Service;
use tokio::time::Instant;

use crate::convert::ServiceId;

/// One watch's grace.
#[derive(Debug, Default)]
pub struct Grace {
    /// The last state of the watch before (services with endpoints only), while the grace
    /// lasts.
    before: BTreeMap<ServiceId, Service>,
    until: Option<Instant>,
    held: BTreeSet<ServiceId>,
}

impl Grace {
    /// A grace of `length` from now over `before` (what the core holds from the previous
    /// watch); none when nothing there had endpoints.
    pub fn new(before: &BTreeMap<ServiceId, Service>, length: Duration) -> Self {
        let before: BTreeMap<ServiceId, Service> = before
            .iter()
            .filter(|(_, s)| !s.endpoints.is_empty())
            .map(|(id, s)| (id.clone(), s.clone()))
            .collect();
        let until = (!before.is_empty() && !length.is_zero()).then(|| Instant::now() + length);
        Self {
            before,
            until,
            held: BTreeSet::new(),
        }
    }

    /// What to serve for `id`, given what the registry says now (`None`: it has no such
    /// service): that, unless the grace holds the last version.
    pub fn serve(&mut self, id: &ServiceId, now: Option<Service>) -> Option<Service> {
        let empty = now.as_ref().is_none_or(|s| s.endpoints.is_empty());
        if empty && self.running() {
            if let Some(last) = self.before.get(id) {
                if self.held.insert(id.clone()) {
                    tracing::info!(service = %id, "Nacos has no instance of this service since it came back; its last endpoints are kept during the startup grace.");
                }
                return Some(last.clone());
            }
        }
        if self.held.remove(id) {
            tracing::info!(service = %id, endpoints = now.as_ref().map_or(0, |s| s.endpoints.len()), "Service back from the startup grace.");
        }
        now
    }

    /// Whether `id` is served from before the restart now.
    pub fn holds(&self, id: &ServiceId) -> bool {
        self.held.contains(id)
    }

    /// The ids held so far.
    pub fn held(&self) -> impl Iterator<Item = &ServiceId> {
        self.held.iter()
    }

    /// When the grace ends, while it runs and holds something.
    pub fn deadline(&self) -> Option<Instant> {
        self.until.filter(|_| !self.held.is_empty())
    }

    /// Ends the grace: the ids that were held, for the watch to serve as the registry has them.
    pub fn end(&mut self) -> Vec<ServiceId> {
        self.until = None;
        self.before.clear();
        let held = std::mem::take(&mut self.held);
        if !held.is_empty() {
            tracing::info!(
                services = held.len(),
                "Startup grace over; serving what Nacos has for the services it held."
            );
        }
        held.into_iter().collect()
    }

    fn running(&self) -> bool {
        self.until.is_some_and(|u| Instant::now() < u)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcp_core::{Endpoint, ServiceKey};

    fn svc(name: &str, endpoints: usize) -> Service {
        let mut s = Service::new(ServiceKey::new(name), name.to_string());
        s.endpoints = (0..endpoints)
            .map(|i| Endpoint {
                address: format!("10.0.0.{i}"),
                ..Endpoint::default()
            })
            .collect();
        s
    }

    #[tokio::test(start_paused = true)]
    async fn a_service_that_lost_every_endpoint_is_held_until_they_return_or_the_grace_ends() {
        let (a, b, c) = (
            ServiceId::new("public", "G", "a"),
            ServiceId::new("public", "G", "b"),
            ServiceId::new("public", "G", "c"),
        );
        let before = BTreeMap::from([
            (a.clone(), svc("a", 2)),
            (b.clone(), svc("b", 1)),
            (c.clone(), svc("c", 0)),
        ]);
        let mut g = Grace::new(&before, Duration::from_secs(30));
        // a's client is back first; b's is not, and b is not even listed yet; c never had any.
        assert_eq!(g.serve(&a, Some(svc("a", 1))), Some(svc("a", 1)));
        assert_eq!(g.serve(&b, None), Some(svc("b", 1)), "held");
        assert_eq!(g.serve(&c, None), None, "never had endpoints: not held");
        assert!(g.holds(&b) && !g.holds(&a));
        assert!(g.deadline().is_some());
        // b's push brings its endpoint back: released.
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(g.serve(&b, Some(svc("b", 1))), Some(svc("b", 1)));
        assert_eq!(g.deadline(), None, "nothing held");
        // It empties again within the grace: held again; after the grace, believed.
        assert_eq!(g.serve(&b, Some(svc("b", 0))), Some(svc("b", 1)));
        tokio::time::advance(Duration::from_secs(26)).await;
        assert_eq!(g.end(), std::slice::from_ref(&b));
        assert_eq!(g.serve(&b, Some(svc("b", 0))), Some(svc("b", 0)));
        assert!(g.deadline().is_none());
    }

    #[test]
    fn the_first_watch_and_a_zero_grace_hold_nothing() {
        let a = ServiceId::new("public", "G", "a");
        let mut first = Grace::new(&BTreeMap::new(), Duration::from_secs(30));
        assert_eq!(first.serve(&a, None), None);
        let before = BTreeMap::from([(a.clone(), svc("a", 1))]);
        let mut off = Grace::new(&before, Duration::ZERO);
        assert_eq!(off.serve(&a, None), None);
    }
}
