//! The leader's requests: a plan's applies and deletes sent a few at a time under the rate
//! limit, each outcome kept in the ledger. An object the API server keeps refusing with a 5xx
//! is rejected on its own after a few tries; only a failure of the way to the API server (no
//! answer, 429, or a round where every request failed) ends the round.

use futures::stream::{FuturesUnordered, StreamExt};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions};
use tokio::time::Instant;

use super::client::{status_code, transient};
use super::object::{self, Stamp, FIELD_MANAGER};
use super::plan::{Action, Backlog, Ledger, Rejected, Written, REJECT_AFTER};
use super::sync::{ObjectWriter, SyncError};
use mcp_core::clip::clip_error;

/// Requests in flight at once (each still waits for the rate limit).
const IN_FLIGHT: usize = 8;

/// Largest object sent, in bytes of JSON: etcd refuses a request over 1.5 MiB by default
/// (`--max-request-bytes`), and the API server answers that with a 500 on every try.
pub(super) const MAX_OBJECT_BYTES: usize = 1_536 * 1024;

/// Why one request did not do what it should.
enum Failure {
    /// The object was not sent: it cannot be rendered, or it is too large to store.
    Unsendable(String),
    /// The API server (or the way to it) said no.
    Api(kube::Error),
}

impl ObjectWriter {
    /// Sends `actions` in order, rate limited, a few at a time; stops early when a newer
    /// served set arrives (the next plan covers it) or leadership is lost (requests in flight
    /// are dropped then: a replica that no longer leads sends nothing more).
    pub(super) async fn execute(
        &mut self,
        ledger: &mut Ledger,
        backlog: &mut Backlog,
        actions: Vec<Action>,
    ) -> Result<(), SyncError> {
        let mut actions = actions.into_iter();
        let mut in_flight = FuturesUnordered::new();
        let mut result = Ok(());
        let (mut answered, mut failed_5xx, mut failures) = (0usize, None, 0usize);
        loop {
            let stop = result.is_err()
                || !self.leads()
                || self.shutdown.is_cancelled()
                || self
                    .snapshots
                    .iter()
                    .any(|rx| rx.has_changed().unwrap_or(false));
            while !stop && in_flight.len() < IN_FLIGHT {
                let Some(action) = actions.next() else { break };
                self.limiter.acquire().await;
                if !self.leads() {
                    break;
                }
                let api = self.api(Some(object::split_name(action.name()).0));
                in_flight.push(send(api, action, self.stamp.clone()));
            }
            let next = tokio::select! {
                next = in_flight.next() => next,
                _ = self.lost_leadership() => {
                    tracing::info!(dropped = in_flight.len(), "Kubernetes output: leadership lost; requests in flight dropped.");
                    break;
                }
            };
            let Some((action, outcome)) = next else {
                break;
            };
            match &outcome {
                Ok(_) => self.count(action.verb(), Ok(())),
                Err(Failure::Api(e)) => self.count(action.verb(), Err(e)),
                Err(Failure::Unsendable(_)) => {}
            }
            match self.record(ledger, backlog, action, outcome) {
                Ok(true) => answered += 1,
                Ok(false) => {}
                Err(Refusal::Server(e)) => {
                    failures += 1;
                    failed_5xx = Some(e);
                }
                Err(Refusal::Round(e)) => result = Err(e),
            }
        }
        // Every request of the round failed with a 5xx, and more than one: the API server is
        // unwell, not one object (one object failing alone is that object's, counted above).
        match (result, failed_5xx) {
            (Ok(()), Some(e)) if answered == 0 && failures > 1 => Err(e),
            (r, _) => r,
        }
    }

    /// Keeps the ledger true to what the API server answered; whether it took the request.
    fn record(
        &self,
        ledger: &mut Ledger,
        backlog: &mut Backlog,
        action: Action,
        outcome: Result<Option<DynamicObject>, Failure>,
    ) -> Result<bool, Refusal> {
        let name = action.name().to_string();
        let e = match (action, outcome) {
            (Action::Apply { entry, shard, .. }, Ok(stored)) => {
                let meta = stored.map(|o| o.metadata).unwrap_or_default();
                backlog.done(&name);
                ledger.rejected.remove(&name);
                ledger.written.insert(
                    name,
                    Written {
                        version: entry.version.to_string(),
                        shard,
                        uid: meta.uid.unwrap_or_default(),
                        generation: meta.generation,
                        stranded: None,
                    },
                );
                return Ok(true);
            }
            (Action::Delete { .. }, Ok(_)) => {
                backlog.done(&name);
                ledger.written.remove(&name);
                return Ok(true);
            }
            (action, Err(Failure::Unsendable(why))) => {
                tracing::error!(name = %name, error = %why, "Kubernetes output: the object cannot be sent; not written.");
                reject(ledger, &action, why);
                return Ok(false);
            }
            (action, Err(Failure::Api(e))) => (action, e),
        };
        let (action, e) = e;
        let code = status_code(&e);
        match (&action, code) {
            // No answer, or too many requests: the way to the API server, not this object.
            (_, None | Some(429)) => Err(Refusal::Round(SyncError::Write {
                verb: action.verb(),
                name,
                source: e,
            })),
            (_, Some(_)) if transient(&e) => {
                let tries = backlog.failed(&action, Instant::now());
                let text = clip_error(e.to_string());
                if tries >= REJECT_AFTER {
                    tracing::warn!(name = %name, tries, error = %text, "Kubernetes output: the API server keeps failing this object; rejected until it changes or the next resync.");
                    backlog.forget(&name);
                    reject(ledger, &action, text);
                } else {
                    tracing::warn!(name = %name, tries, error = %text, "Kubernetes output: the API server failed this object; tried again later.");
                }
                Err(Refusal::Server(SyncError::Write {
                    verb: action.verb(),
                    name,
                    source: e,
                }))
            }
            (Action::Apply { owned: false, .. }, Some(409)) => {
                tracing::warn!(name = %name, error = %e, "Kubernetes output: a ServiceEntry of this name exists and is not this adapter's; left alone.");
                ledger.foreign.insert(name);
                Ok(true)
            }
            // Our object was deleted and the name re-created by someone else (the apply was
            // conditional on the uid we knew): theirs now.
            (Action::Apply { owned: true, .. }, Some(409 | 422)) if uid_mismatch(&e) => {
                tracing::warn!(name = %name, error = %e, "Kubernetes output: the object was re-created by someone else; left alone.");
                ledger.written.remove(&name);
                ledger.foreign.insert(name);
                Ok(true)
            }
            // Gone already, or re-created by someone else (uid precondition): not ours.
            (Action::Delete { .. }, Some(404 | 409)) => {
                backlog.done(&name);
                ledger.written.remove(&name);
                Ok(true)
            }
            _ => {
                let text = clip_error(e.to_string());
                tracing::warn!(name = %name, error = %text, "Kubernetes output: the API server refused the object; retried when it changes.");
                reject(ledger, &action, text);
                Ok(true)
            }
        }
    }
}

/// A request that failed in a way that matters beyond its object.
enum Refusal {
    /// A 5xx for this object (counted against it; the round goes on).
    Server(SyncError),
    /// The round stops and backs off.
    Round(SyncError),
}

/// Whether the API server refused the request because the object's uid is not the one sent.
fn uid_mismatch(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.message.to_ascii_lowercase().contains("uid"),
        _ => false,
    }
}

/// Sends one request; an apply returns the object as stored.
async fn send(
    api: Api<DynamicObject>,
    action: Action,
    stamp: Stamp,
) -> (Action, Result<Option<DynamicObject>, Failure>) {
    let name = object::split_name(action.name()).1.to_string();
    let outcome = match &action {
        Action::Apply {
            entry,
            shard,
            owned,
            uid,
        } => {
            let uid = owned.then_some(uid.as_str());
            match object::render(entry, shard.as_deref(), &stamp, uid) {
                Err(e) => Err(Failure::Unsendable(e.to_string())),
                Ok(obj) => match serde_json::to_vec(&obj).map(|b| b.len()) {
                    Ok(size) if size > MAX_OBJECT_BYTES => Err(Failure::Unsendable(format!(
                        "the object is {size} bytes, over the {MAX_OBJECT_BYTES} bytes etcd stores by default"
                    ))),
                    _ => {
                        // Force only on our own objects: on a name we do not hold yet, a field
                        // another manager set is a conflict (409), never taken over.
                        let mut params = PatchParams::apply(FIELD_MANAGER);
                        if *owned {
                            params = params.force();
                        }
                        api.patch(&name, &params, &Patch::Apply(&obj))
                            .await
                            .map(Some)
                            .map_err(Failure::Api)
                    }
                },
            }
        }
        Action::Delete { uid, .. } => {
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            api.delete(&name, &params)
                .await
                .map(|_| None)
                .map_err(Failure::Api)
        }
    };
    (action, outcome)
}

fn reject(ledger: &mut Ledger, action: &Action, message: String) {
    ledger.rejected.insert(
        action.name().to_string(),
        Rejected {
            version: action.version().to_string(),
            message,
        },
    );
}
