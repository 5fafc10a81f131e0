//! Reading many services from Consul at once, with bounded concurrency, cheaply when they did
//! not change: a service whose own `X-Consul-Index` did not move costs one request with an empty
//! answer.
//!
//! Apart from what is done with the answers ([`super::service`], [`super::sweep`]): this only
//! talks to Consul, and tells one service failing from Consul itself being down.

use futures::stream::{self, StreamExt};

use super::Inner;
use crate::client::Indexed;
use crate::convert::HealthEntry;
use crate::error::ConsulError;

/// The outcome of looking at one service during a sweep.
pub(super) enum Looked {
    /// Its index did not move.
    Unchanged,
    /// It changed: its new state.
    Fetched(Indexed<Vec<HealthEntry>>),
}

/// How to look at one service.
#[derive(Clone, Copy, Debug)]
pub(super) enum How {
    /// Compare its own index with the one last fetched (0: fetch it), from the leader.
    Compare(u64),
    /// Fetch it from the leader.
    Fetch,
    /// Fetch it after a change at this index named it: from any server, checked against it.
    Since(u64),
}

/// What looking at some services found, per service name.
pub(super) type Results = Vec<(String, Result<Looked, ConsulError>)>;

impl Inner {
    /// Looks at every named service with bounded concurrency: a service whose own index did
    /// not move costs one request with an empty answer; a changed one is fetched.
    pub(super) async fn look(&self, names: Vec<(String, How)>) -> Results {
        stream::iter(names)
            .map(|(name, how)| {
                let client = self.client.clone();
                async move {
                    let r = async {
                        match how {
                            How::Compare(old) => {
                                if old != 0 && client.health_index(&name).await? == old {
                                    return Ok(Looked::Unchanged);
                                }
                            }
                            How::Since(min) => {
                                return Ok(Looked::Fetched(client.health_since(&name, min).await?))
                            }
                            How::Fetch => {}
                        }
                        Ok(Looked::Fetched(client.health(&name).await?))
                    }
                    .await;
                    (name, r)
                }
            })
            .buffer_unordered(self.concurrency)
            .collect()
            .await
    }

    /// Fails the whole watch when Consul itself is down (every request failed to connect):
    /// that is the registry's health, not one service's.
    pub(super) fn all_unreachable(
        results: &[(String, Result<Looked, ConsulError>)],
    ) -> Option<ConsulError> {
        let unreachable =
            |r: &Result<Looked, ConsulError>| matches!(r, Err(ConsulError::Unreachable { .. }));
        if results.is_empty() || !results.iter().all(|(_, r)| unreachable(r)) {
            return None;
        }
        results.iter().find_map(|(_, r)| match r {
            Err(ConsulError::Unreachable { addr, message }) => Some(ConsulError::Unreachable {
                addr: addr.clone(),
                message: message.clone(),
            }),
            _ => None,
        })
    }
}
