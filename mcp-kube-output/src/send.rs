//! The leader's requests: a plan's applies and deletes sent a few at a time under the rate
//! limit, each outcome kept in the ledger. A 5xx is counted against its object only when the
//! same round shows that the API server takes writes: another request went through, or, in a
//! round of nothing else, a dry-run create of a probe ServiceEntry (it passes admission and its
//! webhooks, and stores nothing). An object refused that way a few times in a row is rejected on
//! its own. A round with nothing taken (the API server unwell: an istiod rollout whose validating
//! webhook answers 500 to every write, an etcd leader election) counts against no object: it
//! ends the round, which is tried again after a back-off, and the output reports itself failing
//! meanwhile. So do the failures of the way to the API server (no answer, 429).

use futures::stream::{FuturesUnordered, StreamExt};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions};
use tokio::time::Instant;

use super::client::{status_code, transient};
use super::object::{self, Stamp, FIELD_MANAGER};
use super::plan::{Action, Backlog, Ledger, Rejected, Written, REJECT_AFTER};
use super::sync::{ObjectWriter, SyncError};
use mcp_core::clip::clip_error;

/// The name of the dry-run ServiceEntry that asks whether the API server takes writes.
const PROBE_NAME: &str = "mcp-adapter-write-probe";

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
        let mut answered = 0usize;
        // 5xx answers, judged once the round shows whether the API server took anything.
        let mut failed_5xx: Vec<(Action, kube::Error)> = Vec::new();
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
                Ok(true) => {
                    answered += 1;
                }
                Ok(false) => {}
                Err(Refusal::Server(failed)) => failed_5xx.push(*failed),
                Err(Refusal::Round(e)) => result = Err(e),
            }
        }
        if answered == 0 && !failed_5xx.is_empty() && result.is_ok() {
            // Nothing else went through: whether the API server takes writes at all.
            let namespace = object::split_name(failed_5xx[0].0.name()).0.to_string();
            if self.takes_writes(&namespace).await {
                answered += 1;
            }
        }
        if answered == 0 {
            // Nothing taken: the API server, not these objects. None is counted; the round
            // fails (unless it already did) and is tried again after a back-off.
            if let (Ok(()), Some((action, e))) = (&result, failed_5xx.pop()) {
                result = Err(SyncError::Write {
                    verb: action.verb(),
                    name: action.name().to_string(),
                    source: e,
                });
            }
            return result;
        }
        for (action, e) in failed_5xx {
            self.count_failure(ledger, backlog, action, e);
        }
        result
    }

    /// Whether the API server takes a write of a ServiceEntry in `namespace` now: a dry-run
    /// create of a probe (it goes through admission, webhooks included, and stores nothing).
    /// An answer other than a 5xx (a 409: it exists) says the way is open.
    async fn takes_writes(&mut self, namespace: &str) -> bool {
        let probe: DynamicObject = match serde_json::from_value(serde_json::json!({
            "apiVersion": "networking.istio.io/v1",
            "kind": "ServiceEntry",
            "metadata": {"name": PROBE_NAME, "namespace": namespace},
            "spec": {
                "hosts": ["write-probe.mcp-adapter.example"],
                "location": "MESH_EXTERNAL",
                "resolution": "DNS",
                "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}],
            },
        })) {
            Ok(p) => p,
            Err(_) => return false,
        };
        let params = PostParams {
            dry_run: true,
            field_manager: Some(FIELD_MANAGER.to_string()),
        };
        self.limiter.acquire().await;
        let answer = self.api(Some(namespace)).create(&params, &probe).await;
        self.count("probe", answer.as_ref().map(|_| ()));
        match answer {
            Ok(_) => true,
            Err(e) => status_code(&e).is_some_and(|c| c < 500 && c != 429),
        }
    }

    /// A 5xx for `action` in a round where the API server took other requests: counted against
    /// the object, which is rejected after a few in a row.
    fn count_failure(
        &self,
        ledger: &mut Ledger,
        backlog: &mut Backlog,
        action: Action,
        e: kube::Error,
    ) {
        let name = action.name().to_string();
        let tries = backlog.failed(&action, Instant::now());
        let text = clip_error(e.to_string());
        if tries >= REJECT_AFTER {
            tracing::warn!(name = %name, tries, error = %text, "Kubernetes output: the API server keeps failing this object while it takes others; rejected until it changes or the next resync.");
            backlog.forget(&name);
            reject(ledger, &action, text);
        } else {
            tracing::warn!(name = %name, tries, error = %text, "Kubernetes output: the API server failed this object while it took others; tried again later.");
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
            // Judged with the round's other answers (`execute`).
            (_, Some(_)) if transient(&e) => Err(Refusal::Server(Box::new((action, e)))),
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
    /// A 5xx for this object: counted against it if the round's other requests went through.
    Server(Box<(Action, kube::Error)>),
    /// The round stops and backs off.
    Round(SyncError),
}

/// Whether the API server refused the request because the object's uid is not the one sent:
/// the API server's own words for it, a uid precondition that failed (409: `Precondition
/// failed: UID in precondition: ...`) or a uid that may not change (422: `metadata.uid:
/// Invalid value: ...: field is immutable`). Not any message with "uid" in it: a validation
/// error naming a host such as `guide-svc` is the object's own fault, not someone else's object.
fn uid_mismatch(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => match s.code {
            409 => s
                .message
                .contains("Precondition failed: UID in precondition"),
            422 => s.message.contains("metadata.uid: Invalid value"),
            _ => false,
        },
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

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure(message, "")
                .with_code(code)
                .boxed(),
        )
    }

    /// #43 item 8: the API server's own uid refusals, and not a validation error that happens
    /// to contain "uid".
    #[test]
    fn a_uid_mismatch_is_the_precondition_not_any_uid_in_the_text() {
        for (code, message) in [
            (
                409,
                r#"Operation cannot be fulfilled on serviceentries.networking.istio.io "a": Precondition failed: UID in precondition: 1, UID in object meta: 2"#,
            ),
            (
                422,
                r#"ServiceEntry.networking.istio.io "a" is invalid: metadata.uid: Invalid value: "2": field is immutable"#,
            ),
        ] {
            assert!(uid_mismatch(&api_error(code, message)), "{code} {message}");
        }
        for (code, message) in [
            (422, r#"admission webhook "validation.istio.io" denied the request: configuration is invalid: invalid host guide-svc..example"#),
            (409, "the object has been modified; please apply your changes to the latest version (uid-less)"),
            (500, "Precondition failed: UID in precondition: 1, UID in object meta: 2"),
        ] {
            assert!(!uid_mismatch(&api_error(code, message)), "{code} {message}");
        }
    }
}
