//! The output's writer: makes the API server hold the newest served set, one request per object
//! that changed, while this replica leads.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::stream::{FuturesUnordered, StreamExt};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, Preconditions};
use kube::Client;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::client::{code_label, service_entries, status_code, transient};
use super::limiter::Limiter;
use super::object::{self, Owner, ANNOTATION_VERSION, FIELD_MANAGER, LABEL_SHARD};
use super::plan::{Action, Desired, Ledger, Plan, Rejected, Written};
use crate::metrics::OutputMetrics;
use crate::{RegistrySynced, SharedOutputStatus};
use mcp_core::cache::Snapshot;
use mcp_core::clip::clip_error;
use mcp_core::retry::Backoff;

/// Requests in flight at once (each still waits for the rate limit).
const IN_FLIGHT: usize = 8;
/// Between two looks at whether the registry's first sync is done.
const SYNC_POLL: Duration = Duration::from_millis(100);
/// Page size of the metadata list.
const LIST_PAGE: u32 = 500;

pub(super) struct ObjectWriter {
    pub(super) client: Client,
    pub(super) owner: Owner,
    /// `--output-namespaces` (empty: any).
    pub(super) namespaces: Vec<String>,
    pub(super) limiter: Limiter,
    pub(super) resync: Duration,
    pub(super) snapshots: Vec<watch::Receiver<Option<Arc<Snapshot>>>>,
    /// Each shard's label value.
    pub(super) shard_labels: Vec<Option<String>>,
    pub(super) status: SharedOutputStatus,
    /// Whether the registry has synced once (nothing is written before).
    pub(super) registry_synced: RegistrySynced,
    pub(super) metrics: OutputMetrics,
    pub(super) leader: watch::Receiver<bool>,
    pub(super) shutdown: CancellationToken,
}

/// A failure that stops this round (the API server is unwell or unreachable); retried with
/// backoff.
#[derive(Debug, thiserror::Error)]
enum SyncError {
    #[error("list ServiceEntries{where_}: {source}")]
    List { where_: String, source: kube::Error },
    #[error("{verb} ServiceEntry {name}: {source}")]
    Write {
        verb: &'static str,
        name: String,
        source: kube::Error,
    },
}

enum Wake {
    Changed,
    Shutdown,
}

impl ObjectWriter {
    pub(super) async fn run(mut self) {
        let mut ledger: Option<Ledger> = None;
        let mut backoff = Backoff::new();
        let mut next_list = Instant::now();
        loop {
            if self.shutdown.is_cancelled() {
                return;
            }
            let leads = *self.leader.borrow_and_update();
            if !leads || !self.registry_synced() {
                if !leads && ledger.take().is_some() {
                    self.update_status(|o| {
                        o.leader = false;
                        o.in_step = false;
                        o.pending = 0;
                        o.behind_since = None;
                    });
                    self.metrics.kube_pending.set(0);
                    self.metrics.kube_lag.set(0.0);
                }
                // What is served now is re-read when this replica leads: wake for what comes
                // after it.
                for rx in &mut self.snapshots {
                    rx.borrow_and_update();
                }
                if let Wake::Shutdown = self.wait(Some(SYNC_POLL), None).await {
                    return;
                }
                continue;
            }
            self.update_status(|o| o.leader = true);
            if ledger.is_none() || Instant::now() >= next_list {
                match self.list().await {
                    Ok(listed) => {
                        let old = ledger.take().unwrap_or_default();
                        ledger = Some(old.relisted(listed));
                        next_list = Instant::now() + self.resync;
                    }
                    Err(e) => {
                        if let Wake::Shutdown = self.failed(e, &mut backoff).await {
                            return;
                        }
                        continue;
                    }
                }
            }
            let Some(current) = ledger.as_mut() else {
                continue;
            };
            let desired = self.desired();
            let plan = current.plan(&desired, |ns| self.allowed(ns));
            self.report(current, &plan);
            if plan.actions.is_empty() {
                backoff.synced(Instant::now());
                if let Wake::Shutdown = self.wait(None, Some(next_list)).await {
                    return;
                }
                continue;
            }
            if let Err(e) = self.execute(current, plan.actions).await {
                if let Wake::Shutdown = self.failed(e, &mut backoff).await {
                    return;
                }
            } else {
                self.update_status(|o| o.last_error = None);
            }
        }
    }

    fn registry_synced(&self) -> bool {
        (self.registry_synced)()
    }

    fn allowed(&self, namespace: &str) -> bool {
        self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace)
    }

    /// The newest served set of every shard, marking it seen.
    fn desired(&mut self) -> Desired {
        let mut desired = Desired::new();
        for (rx, shard) in self.snapshots.iter_mut().zip(&self.shard_labels) {
            let snapshot = rx.borrow_and_update().clone();
            for entry in snapshot.iter().flat_map(|s| s.iter()) {
                desired.insert(entry.name.clone(), (entry.clone(), shard.clone()));
            }
        }
        desired
    }

    /// Waits for a new snapshot, a leadership change, `poll` or `until`.
    async fn wait(&mut self, poll: Option<Duration>, until: Option<Instant>) -> Wake {
        let changes = self
            .snapshots
            .iter_mut()
            .map(|rx| Box::pin(async move { rx.changed().await.is_ok() }))
            .collect::<FuturesUnordered<_>>();
        let mut changes = changes;
        let poll = async {
            match poll {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        let until = async {
            match until {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.shutdown.cancelled() => Wake::Shutdown,
            _ = self.leader.changed() => Wake::Changed,
            Some(true) = changes.next() => Wake::Changed,
            _ = poll => Wake::Changed,
            _ = until => Wake::Changed,
        }
    }

    async fn failed(&mut self, e: SyncError, backoff: &mut Backoff) -> Wake {
        let text = clip_error(e.to_string());
        tracing::warn!(error = %text, "Kubernetes output: the API server did not take the change; retrying with backoff.");
        self.update_status(|o| o.last_error = Some(text));
        let delay = backoff.failed(Instant::now());
        tokio::select! {
            _ = self.shutdown.cancelled() => Wake::Shutdown,
            _ = tokio::time::sleep(delay) => Wake::Changed,
        }
    }

    fn api(&self, namespace: Option<&str>) -> Api<DynamicObject> {
        let resource = service_entries();
        match namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &resource),
            None => Api::all_with(self.client.clone(), &resource),
        }
    }

    fn count(&self, verb: &str, result: Result<(), &kube::Error>) {
        self.metrics
            .kube_requests
            .with_label_values(&[verb, &code_label(&result)])
            .inc();
    }

    /// Every ServiceEntry in the output's namespaces, metadata only: ours by the ownership
    /// labels, every other name foreign.
    async fn list(&mut self) -> Result<Ledger, SyncError> {
        let scopes: Vec<Option<String>> = if self.namespaces.is_empty() {
            vec![None]
        } else {
            self.namespaces.iter().cloned().map(Some).collect()
        };
        let mut ledger = Ledger::default();
        for scope in scopes {
            let api = self.api(scope.as_deref());
            let mut params = ListParams::default().limit(LIST_PAGE);
            loop {
                self.limiter.acquire().await;
                let page = api.list_metadata(&params).await;
                self.count("list", page.as_ref().map(|_| ()));
                let page = page.map_err(|source| SyncError::List {
                    where_: scope
                        .as_ref()
                        .map(|ns| format!(" in namespace {ns}"))
                        .unwrap_or_default(),
                    source,
                })?;
                for item in &page.items {
                    let meta = &item.metadata;
                    let name = format!(
                        "{}/{}",
                        meta.namespace.as_deref().unwrap_or_default(),
                        meta.name.as_deref().unwrap_or_default()
                    );
                    let labels = meta.labels.clone().unwrap_or_default();
                    if self.owner.owns(&labels) {
                        let version = meta
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get(ANNOTATION_VERSION))
                            .cloned()
                            .unwrap_or_default();
                        ledger.written.insert(
                            name,
                            Written {
                                version,
                                shard: labels.get(LABEL_SHARD).cloned(),
                                uid: meta.uid.clone().unwrap_or_default(),
                                generation: meta.generation,
                            },
                        );
                    } else {
                        ledger.foreign.insert(name);
                    }
                }
                match page.metadata.continue_.filter(|c| !c.is_empty()) {
                    Some(token) => params = params.continue_token(&token),
                    None => break,
                }
            }
        }
        tracing::info!(
            objects = ledger.written.len(),
            foreign = ledger.foreign.len(),
            "Kubernetes output: listed the API server's ServiceEntries."
        );
        Ok(ledger)
    }

    /// Sends the plan's requests (applies first), rate limited, a few at a time; stops early
    /// when a newer served set arrives (the next plan covers it) or leadership is lost.
    async fn execute(
        &mut self,
        ledger: &mut Ledger,
        actions: Vec<Action>,
    ) -> Result<(), SyncError> {
        let mut actions = actions.into_iter();
        let mut in_flight = FuturesUnordered::new();
        let mut result = Ok(());
        loop {
            let stop = result.is_err()
                || !*self.leader.borrow()
                || self.shutdown.is_cancelled()
                || self
                    .snapshots
                    .iter()
                    .any(|rx| rx.has_changed().unwrap_or(false));
            while !stop && in_flight.len() < IN_FLIGHT {
                let Some(action) = actions.next() else { break };
                self.limiter.acquire().await;
                in_flight.push(send(self.api_for(&action), action));
            }
            let Some((action, outcome)) = in_flight.next().await else {
                break;
            };
            let verb = match &action {
                Action::Apply { .. } => "apply",
                Action::Delete { .. } => "delete",
            };
            match &outcome {
                Ok(_) => self.count(verb, Ok(())),
                Err(Failure::Api(e)) => self.count(verb, Err(e)),
                Err(Failure::Render(_)) => {}
            }
            if let Err(e) = record(ledger, action, outcome) {
                result = Err(e);
            }
        }
        result
    }

    fn api_for(&self, action: &Action) -> Api<DynamicObject> {
        self.api(Some(object::split_name(action.name()).0))
    }

    fn report(&self, ledger: &Ledger, plan: &Plan) {
        let pending = plan.actions.len();
        self.metrics.kube_pending.set(pending as i64);
        self.metrics.kube_objects.set(ledger.written.len() as i64);
        self.metrics.kube_conflicts.set(plan.conflicts.len() as i64);
        self.metrics.kube_rejected.set(ledger.rejected.len() as i64);
        self.update_status(|o| {
            o.leader = true;
            o.objects = ledger.written.len();
            o.pending = pending;
            o.in_step = pending == 0;
            if pending == 0 {
                o.behind_since = None;
            } else if o.behind_since.is_none() {
                o.behind_since = Some(SystemTime::now());
            }
            o.conflicts = plan.conflicts.clone();
            o.refused = plan.refused.clone();
            o.rejected = ledger.rejected.clone();
        });
        let lag = self.status.lock().lag_secs();
        self.metrics.kube_lag.set(lag);
    }

    fn update_status(&self, f: impl FnOnce(&mut super::OutputStatus)) {
        f(&mut self.status.lock());
    }
}

/// Why one request did not do what it should.
enum Failure {
    /// The entry's bytes could not be rendered (no request was sent).
    Render(object::RenderError),
    /// The API server (or the way to it) said no.
    Api(kube::Error),
}

/// Sends one request; an apply returns the object as stored.
async fn send(
    api: Api<DynamicObject>,
    action: Action,
) -> (Action, Result<Option<DynamicObject>, Failure>) {
    let name = object::split_name(action.name()).1.to_string();
    let outcome = match &action {
        Action::Apply {
            entry,
            shard,
            owned,
        } => match object::render(entry, shard.as_deref()) {
            Err(e) => Err(Failure::Render(e)),
            Ok(obj) => {
                // Force only on our own objects: on a name we do not hold yet, a field another
                // manager set is a conflict (409), never taken over.
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

/// Keeps the ledger true to what the API server answered.
fn record(
    ledger: &mut Ledger,
    action: Action,
    outcome: Result<Option<DynamicObject>, Failure>,
) -> Result<(), SyncError> {
    let name = action.name().to_string();
    match (action, outcome) {
        (Action::Apply { entry, shard, .. }, Ok(stored)) => {
            let meta = stored.map(|o| o.metadata).unwrap_or_default();
            ledger.rejected.remove(&name);
            ledger.written.insert(
                name,
                Written {
                    version: entry.version.to_string(),
                    shard,
                    uid: meta.uid.unwrap_or_default(),
                    generation: meta.generation,
                },
            );
        }
        (Action::Delete { .. }, Ok(_)) => {
            ledger.written.remove(&name);
        }
        (action, Err(Failure::Render(e))) => {
            tracing::error!(name = %name, error = %e, "Kubernetes output: cannot render the entry; not written.");
            reject(ledger, &action, e.to_string());
        }
        (action, Err(Failure::Api(e))) => {
            let code = status_code(&e);
            match (&action, code) {
                _ if transient(&e) => {
                    let verb = match action {
                        Action::Apply { .. } => "apply",
                        Action::Delete { .. } => "delete",
                    };
                    return Err(SyncError::Write {
                        verb,
                        name,
                        source: e,
                    });
                }
                (Action::Apply { owned: false, .. }, Some(409)) => {
                    tracing::warn!(name = %name, error = %e, "Kubernetes output: a ServiceEntry of this name exists and is not this adapter's; left alone.");
                    ledger.foreign.insert(name);
                }
                // Gone already, or re-created by someone else (uid precondition): not ours.
                (Action::Delete { .. }, Some(404 | 409)) => {
                    ledger.written.remove(&name);
                }
                _ => {
                    let text = clip_error(e.to_string());
                    tracing::warn!(name = %name, error = %text, "Kubernetes output: the API server refused the object; retried when it changes.");
                    reject(ledger, &action, text);
                }
            }
        }
    }
    Ok(())
}

fn reject(ledger: &mut Ledger, action: &Action, message: String) {
    let version = match action {
        Action::Apply { entry, .. } => entry.version.to_string(),
        Action::Delete { .. } => String::new(),
    };
    ledger
        .rejected
        .insert(action.name().to_string(), Rejected { version, message });
}
