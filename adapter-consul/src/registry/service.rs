//! What one watch knows of each service, and the events that follow from reading one: its
//! `Upsert` or `Remove`, its problems, and when a service that cannot be read is tried again.
//!
//! Apart from the sweeps ([`super::sweep`]) that decide *which* services to read: this is what
//! is done with one service once it has been read, or could not be, wherever that happened.

use std::sync::atomic::Ordering;
use std::time::Duration;

use mcp_core::retry::Backoff;
use mcp_core::{EventSender, RegistryError, RegistryEvent, Service, ServiceKey};
use tokio::time::Instant;

use super::Inner;
use crate::client::Indexed;
use crate::convert::{convert, HealthEntry};
use crate::error::ConsulError;

/// Delay before the first retry of a service that cannot be read.
const RETRY_FIRST: Duration = Duration::from_millis(500);
/// Longest delay between retries of one service.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Per-service retry delays: doubling from [`RETRY_FIRST`] up to [`RETRY_MAX`], exact (a
/// service fails at its own time; the delay reported is the one waited), and starting over
/// once the service reads again.
fn retry_backoff() -> Backoff {
    Backoff::doubling(RETRY_FIRST, RETRY_MAX)
}

/// Scopes of per-service problems start with this.
pub(super) const SCOPE_PREFIX: &str = "consul service ";

fn problem_scope(name: &str) -> String {
    format!("{SCOPE_PREFIX}{name}")
}

/// What one watch knows of one service.
#[derive(Debug, Default)]
pub(super) struct ServiceState {
    /// `X-Consul-Index` of its last good fetch; 0 = fetch it at the next sweep.
    pub(super) index: u64,
    /// An `Upsert` of it is being served.
    pub(super) served: bool,
    /// Conversion problems of its last good state.
    problems: Vec<String>,
    /// Failing: failures in a row and when to try again.
    pub(super) retry: Option<Retry>,
    /// Its own query lost its connection: no new one before this.
    pub(super) rewatch_at: Option<Instant>,
    /// When a change of it was last read, as a count of the changes this registry has read
    /// (0: none since the first list): the services that changed last hold the own queries.
    pub(super) changed: u64,
}

/// The retries of a service that cannot be read.
#[derive(Debug)]
pub(super) struct Retry {
    /// Its failures in a row and the delay after the next one.
    backoff: Backoff,
    /// When to try it again.
    pub(super) at: Instant,
}

impl Inner {
    /// Sends a service's problems when it has some, or had some before (to clear them).
    pub(super) async fn report(
        &self,
        tx: &EventSender,
        name: &str,
        problems: Vec<String>,
    ) -> Result<(), RegistryError> {
        let event = self
            .reported
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .update(&problem_scope(name), problems);
        if let Some(event) = event {
            tx.send(event).await?;
        }
        Ok(())
    }

    /// Converts a fetched service and records it; the service to serve, if any.
    pub(super) async fn accept(
        &self,
        tx: &EventSender,
        name: &str,
        state: &mut ServiceState,
        list: Indexed<Vec<HealthEntry>>,
    ) -> Result<Option<Service>, RegistryError> {
        let c = convert(name, &list.value, &self.settings);
        for p in &c.problems {
            tracing::warn!(service = %name, problem = %p, "Skipped part of a Consul service.");
        }
        if state.retry.take().is_some() {
            tracing::info!(service = %name, "Consul service readable again.");
        }
        state.index = list.index;
        state.problems = c.problems.clone();
        self.report(tx, name, c.problems).await?;
        let mut last = self.last_good.lock().unwrap_or_else(|p| p.into_inner());
        match &c.service {
            Some(s) => {
                last.insert(name.to_string(), s.clone());
            }
            None => {
                last.remove(name);
            }
        }
        Ok(c.service)
    }

    /// One service could not be read: keep what is served of it, say why on its problems, and
    /// try it again alone after its own backoff.
    pub(super) async fn failed(
        &self,
        tx: &EventSender,
        name: &str,
        state: &mut ServiceState,
        error: &ConsulError,
    ) -> Result<(), RegistryError> {
        let now = Instant::now();
        let mut backoff = state.retry.take().map_or_else(retry_backoff, |r| r.backoff);
        let delay = backoff.failed(now);
        let failures = backoff.failures();
        state.retry = Some(Retry {
            backoff,
            at: now + delay,
        });
        tracing::warn!(service = %name, %error, failures, retry_in = ?delay, "Cannot read a Consul service; serving its last good state.");
        let mut problems = state.problems.clone();
        problems.push(format!(
            "consul service {name}: cannot be read ({error}); its last good state stays served; retrying it alone (failures in a row: {failures})"
        ));
        self.report(tx, name, problems).await
    }

    /// Applies a fetched service: `Upsert`, or `Remove` when it no longer has instances to serve.
    pub(super) async fn apply(
        &self,
        tx: &EventSender,
        name: &str,
        state: &mut ServiceState,
        list: Indexed<Vec<HealthEntry>>,
    ) -> Result<(), RegistryError> {
        state.changed = self.changes.fetch_add(1, Ordering::Relaxed) + 1;
        match self.accept(tx, name, state, list).await? {
            Some(s) => {
                state.served = true;
                tx.send(RegistryEvent::Upsert(s)).await?;
            }
            None => {
                if std::mem::take(&mut state.served) {
                    tx.send(RegistryEvent::Remove(ServiceKey::new(name)))
                        .await?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_a_cap() {
        let now = Instant::now();
        let mut b = retry_backoff();
        assert_eq!(b.failed(now), RETRY_FIRST);
        assert_eq!(b.failed(now), RETRY_FIRST * 2);
        for _ in 0..20 {
            b.failed(now);
        }
        assert_eq!(b.failed(now), RETRY_MAX);
    }
}
