//! Which services to read, and when: the full re-list a watch starts with (one `Reset`), the
//! sweeps after a change (every service by its own index, or only those whose health changed),
//! the retries of failing services, and following the catalog's list of services.
//!
//! Apart from the watch loop ([`super`]) that says *when* something changed, and from what is
//! done with each service read ([`super::service`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use mcp_core::{EventSender, RegistryError, RegistryEvent, ServiceKey};
use tokio::time::Instant;

use super::fetch::{How, Looked};
use super::own_watch::OwnWatches;
use super::service::{ServiceState, SCOPE_PREFIX};
use super::{ended, Inner};
use crate::error::ConsulError;

/// Which services a sweep looks at.
#[derive(Clone, Copy, Debug)]
pub(super) enum Which<'a> {
    /// Every one but `except` (just read at the index of the change that causes this sweep):
    /// its own index, fetched only when it moved.
    Unwatched {
        /// Services already read past the change.
        except: &'a BTreeSet<String>,
    },
    /// These, each fetched after the change (at that index) that named it.
    Named(&'a BTreeMap<String, u64>),
    /// These: their own index, fetched only when it moved.
    Look(&'a [String]),
}

impl Inner {
    /// Looks at the services `which` says (none waiting for a retry, none `watched` by its own
    /// query) and applies what changed.
    pub(super) async fn sweep(
        &self,
        tx: &EventSender,
        known: &mut HashMap<String, ServiceState>,
        which: Which<'_>,
        watched: &OwnWatches,
    ) -> Result<(), ConsulError> {
        // A few named services are found by name, not by going through every known one.
        let eligible = |n: &String, k: &ServiceState| k.retry.is_none() && !watched.contains(n);
        let due_now = |n: &String| known.get(n).filter(|k| eligible(n, k));
        let due: Vec<(String, How)> = match which {
            Which::Unwatched { except } => known
                .iter()
                .filter(|(n, k)| eligible(n, k) && !except.contains(*n))
                .map(|(n, k)| (n.clone(), How::Compare(k.index)))
                .collect(),
            Which::Named(names) => names
                .iter()
                .filter(|(n, _)| due_now(n).is_some())
                .map(|(n, i)| (n.clone(), How::Since(*i)))
                .collect(),
            Which::Look(names) => names
                .iter()
                .filter_map(|n| due_now(n).map(|k| (n.clone(), How::Compare(k.index))))
                .collect(),
        };
        let started = std::time::Instant::now();
        let looked = due.len();
        let results = self.look(due).await;
        if let Some(e) = Self::all_unreachable(&results) {
            return Err(e);
        }
        let mut changed = 0usize;
        for (name, r) in results {
            let Some(k) = known.get_mut(&name) else {
                continue;
            };
            match r {
                Ok(Looked::Unchanged) => {}
                Ok(Looked::Fetched(list)) => {
                    changed += 1;
                    self.apply(tx, &name, k, list).await.map_err(|_| ended())?;
                }
                Err(e) => self.failed(tx, &name, k, &e).await.map_err(|_| ended())?,
            }
        }
        tracing::debug!(looked, changed, took = ?started.elapsed(), "Swept Consul services.");
        Ok(())
    }

    /// Tries again the failing services whose backoff has passed.
    pub(super) async fn retry(
        &self,
        tx: &EventSender,
        known: &mut HashMap<String, ServiceState>,
    ) -> Result<(), ConsulError> {
        let now = Instant::now();
        let due: Vec<(String, How)> = known
            .iter()
            .filter(|(_, k)| k.retry.as_ref().is_some_and(|r| r.at <= now))
            .map(|(n, _)| (n.clone(), How::Fetch))
            .collect();
        for (name, r) in self.look(due).await {
            let Some(k) = known.get_mut(&name) else {
                continue;
            };
            match r {
                Ok(Looked::Fetched(list)) => self.apply(tx, &name, k, list).await,
                Ok(Looked::Unchanged) => Ok(()),
                Err(e) => self.failed(tx, &name, k, &e).await,
            }
            .map_err(|_| ended())?;
        }
        Ok(())
    }

    /// Follows a change of the catalog's service list: new services are looked at in the next
    /// sweep, vanished ones removed.
    pub(super) async fn follow_catalog(
        &self,
        tx: &EventSender,
        known: &mut HashMap<String, ServiceState>,
        names: impl Iterator<Item = String>,
    ) -> Result<(), RegistryError> {
        let now: BTreeSet<String> = names.filter(|n| self.wanted(n)).collect();
        for name in &now {
            if !known.contains_key(name) {
                tracing::info!(service = %name, "Consul service appeared.");
                known.insert(name.clone(), ServiceState::default());
            }
        }
        let gone: Vec<String> = known
            .keys()
            .filter(|n| !now.contains(*n))
            .cloned()
            .collect();
        for name in gone {
            tracing::info!(service = %name, "Consul service vanished.");
            let served = known.remove(&name).is_some_and(|k| k.served);
            self.last_good
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&name);
            if served {
                tx.send(RegistryEvent::Remove(ServiceKey::new(name.clone())))
                    .await?;
            }
            self.report(tx, &name, Vec::new()).await?;
        }
        Ok(())
    }

    /// Reads every wanted service of the catalog's `names` and sends them as one `Reset`: a
    /// service that cannot be read keeps what was served of it before this re-list. Clears the
    /// problems of services that vanished since the last watch. What the watch now knows of
    /// each service.
    pub(super) async fn relist<'n>(
        &self,
        tx: &EventSender,
        names: impl Iterator<Item = &'n String>,
    ) -> Result<HashMap<String, ServiceState>, ConsulError> {
        let mut known: HashMap<String, ServiceState> = names
            .filter(|n| self.wanted(n))
            .map(|n| (n.clone(), ServiceState::default()))
            .collect();
        tracing::info!(addr = %self.client.addr(), services = known.len(), "Listing Consul services.");
        let started = std::time::Instant::now();
        let names = known.keys().map(|n| (n.clone(), How::Fetch)).collect();
        let results = self.look(names).await;
        if let Some(e) = Self::all_unreachable(&results) {
            return Err(e);
        }
        let mut services = Vec::with_capacity(results.len());
        for (name, r) in results {
            let Some(k) = known.get_mut(&name) else {
                continue;
            };
            match r {
                Ok(Looked::Fetched(list)) => {
                    if let Some(s) = self.accept(tx, &name, k, list).await.map_err(|_| ended())? {
                        k.served = true;
                        services.push(s);
                    }
                }
                Ok(Looked::Unchanged) => {}
                Err(e) => {
                    // Not readable now: what was served of it before this re-list stays.
                    let last = self
                        .last_good
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get(&name)
                        .cloned();
                    if let Some(s) = last {
                        k.served = true;
                        services.push(s);
                    }
                    self.failed(tx, &name, k, &e).await.map_err(|_| ended())?;
                }
            }
        }
        tracing::info!(services = services.len(), took = ?started.elapsed(), "Listed Consul services.");
        {
            let mut last = self.last_good.lock().unwrap_or_else(|p| p.into_inner());
            last.retain(|n, _| known.get(n).is_some_and(|k| k.served));
        }
        tx.send(RegistryEvent::Reset(services))
            .await
            .map_err(|_| ended())?;
        let stale: Vec<String> = {
            let reported = self.reported.lock().unwrap_or_else(|p| p.into_inner());
            reported
                .scopes()
                .filter_map(|s| s.strip_prefix(SCOPE_PREFIX))
                .filter(|n| !known.contains_key(*n))
                .map(str::to_string)
                .collect()
        };
        for name in stale {
            self.report(tx, &name, Vec::new())
                .await
                .map_err(|_| ended())?;
        }
        Ok(known)
    }
}
