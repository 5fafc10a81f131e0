//! One watch: how it starts, and its loop.
//!
//! A watch logs in (when credentials are set), finds how the server lists services
//! ([`crate::catalog`]), lists the namespaces (unless given), opens a session per namespace,
//! lists each namespace's services, subscribes to each that passes the filters and sends the
//! whole state as one `Reset`. After that the server pushes a service's instance list whenever
//! it changes; only that service is converted and sent, and only when its conversion changed.
//! Every `--service-list-interval` the services are listed again, in a task of its own so that
//! pushes never wait for it: new services are subscribed to, removed ones dropped (only when two
//! listings in a row lack them), in one `Changes` event. Nothing is ever re-listed while nothing
//! changes.
//!
//! What fails for one part only does not end the watch: a namespace the server refuses to list,
//! or a service it refuses a subscription to, keeps what it had, is named on /registryz (the
//! registry is reported unhealthy until it passes) and is tried again at the next listing; the
//! other namespaces and services go on. A session that ends ends the watch.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::StreamExt;
use mcp_core::{EventSender, RegistryError, RegistryEvent, Service, ServiceKey};
use tokio::task::JoinHandle;

use crate::catalog::{self, Listing, Name};
use crate::convert::{convert_service, scope, ServiceId};
use crate::dto::{ServiceInfo, UnreadablePush, PUBLIC};
use crate::grace::Grace;
use crate::http::{HttpClientError, ListingApi};
use crate::inbox::Inbox;
use crate::names::{self, Names};
use crate::registry::Inner;
use crate::session::{Caller, Session};

/// Subscriptions made at once when many services are new (each is one request and answer on
/// the namespace's connection).
const SUBSCRIBE_CONCURRENCY: usize = 16;

/// Runs one watch until it fails (it never ends otherwise).
pub(crate) async fn run(inner: Arc<Inner>, tx: EventSender) -> Result<(), RegistryError> {
    let mut w = Watch::start(inner, tx).await?;
    w.serve().await
}

/// What one listing round found.
#[derive(Debug, Default)]
struct Listed {
    /// The namespaces, when this watch lists them.
    namespaces: Option<Result<Vec<String>, RegistryError>>,
    /// Each namespace's services (filtered), or why they could not be listed.
    services: BTreeMap<String, Result<BTreeSet<Name>, RegistryError>>,
}

/// One watch's view.
struct Watch {
    inner: Arc<Inner>,
    tx: EventSender,
    inbox: Arc<Inbox>,
    listing: Listing,
    /// Whether the namespaces are found by listing (none given, and the listing can).
    lists_namespaces: bool,
    sessions: BTreeMap<String, Session>,
    /// Every subscribed service's last instance list.
    infos: BTreeMap<ServiceId, ServiceInfo>,
    names: Names,
    /// What was sent for each service (given back to the registry's memory at the end).
    sent: BTreeMap<ServiceId, Service>,
    grace: Grace,
    /// Namespaces (or the namespace list) that could not be listed at the last listing.
    trouble: BTreeMap<String, RegistryError>,
    /// Subscriptions the server refused: asked for again at each listing.
    refused: BTreeMap<ServiceId, RegistryError>,
    /// The trouble last reported (`Retrying`), to report only changes and the recovery.
    reported: Option<String>,
    /// Pushes that could not be read, by namespace and service.
    unreadable: BTreeMap<String, BTreeMap<String, String>>,
    /// The listing in flight.
    lister: Option<JoinHandle<Listed>>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(l) = self.lister.take() {
            l.abort();
        }
        self.inner.memory().sent = std::mem::take(&mut self.sent);
    }
}

impl Watch {
    async fn start(inner: Arc<Inner>, tx: EventSender) -> Result<Watch, RegistryError> {
        inner.token().await?;
        let probe_ns = inner
            .namespaces
            .first()
            .cloned()
            .unwrap_or_else(|| PUBLIC.to_string());
        let (groups, globs) = catalog::grpc_groups(&inner.group_allow);
        let listing =
            catalog::detect(|api| inner.http.services_page(api, &probe_ns, 1, 1), groups).await?;
        let server = inner.http.server().http.clone();
        let lists_namespaces = inner.namespaces.is_empty() && matches!(listing, Listing::Http(_));
        if let Listing::Grpc { groups } = &listing {
            tracing::warn!(
                server = %server,
                ?groups,
                ignored_globs = ?globs,
                namespaces = ?if inner.namespaces.is_empty() { vec![PUBLIC.to_string()] } else { inner.namespaces.clone() },
                "Nacos lists no groups or namespaces to this client (Nacos 3 without a user allowed its admin API, or a user without console rights): only these groups and namespaces are watched. Give --group and --nacos-namespace, or credentials that may read the admin API."
            );
        }
        tracing::info!(server = %server, listing = %listing.describe(), "Listing Nacos services.");
        let prior = inner.memory().sent.clone();
        let mut w = Watch {
            grace: Grace::new(&prior, inner.grace),
            inner,
            tx,
            inbox: Arc::default(),
            listing,
            lists_namespaces,
            sessions: BTreeMap::new(),
            infos: BTreeMap::new(),
            names: Names::default(),
            sent: BTreeMap::new(),
            trouble: BTreeMap::new(),
            refused: BTreeMap::new(),
            reported: None,
            unreadable: BTreeMap::new(),
            lister: None,
        };
        let namespaces = if w.lists_namespaces {
            match w.inner.http.namespaces(api(&w.listing)).await {
                Ok(ns) => ns,
                Err(e @ HttpClientError::Unauthorized { .. }) => {
                    tracing::warn!(error = %e, "Nacos refuses to list its namespaces to this user; watching public only (name others with --nacos-namespace).");
                    w.lists_namespaces = false;
                    vec![PUBLIC.to_string()]
                }
                Err(e) => return Err(e.into()),
            }
        } else if w.inner.namespaces.is_empty() {
            vec![PUBLIC.to_string()]
        } else {
            w.inner.namespaces.clone()
        };
        for ns in &namespaces {
            w.open(ns).await?;
        }
        let listed = list(
            Arc::clone(&w.inner),
            w.listing.clone(),
            w.listed_namespaces(),
            w.callers(),
            w.known(),
        )
        .await;
        w.apply_listing(listed).await?;

        // The whole state: what is subscribed, and what the grace keeps of the watch before.
        let mut problems = BTreeMap::new();
        let ids: BTreeSet<ServiceId> = w.infos.keys().chain(prior.keys()).cloned().collect();
        for id in ids {
            let (served, found) = w.evaluate(&id);
            if !found.is_empty() {
                problems.insert(scope(&id), found);
            }
            if let Some(s) = served {
                w.sent.insert(id, s);
            }
        }
        if !w.names.problems().is_empty() {
            problems.insert(names::SCOPE.to_string(), w.names.problems().to_vec());
        }
        tracing::info!(
            server = %server,
            namespaces = w.sessions.len(),
            services = w.sent.len(),
            instances = w.sent.values().map(|s| s.endpoints.len()).sum::<usize>(),
            held = w.grace.held().count(),
            "Read Nacos."
        );
        w.tx.send(RegistryEvent::Reset(w.sent.values().cloned().collect()))
            .await?;
        let events = w.inner.memory().ledger.replace_all(problems);
        for ev in events {
            w.tx.send(ev).await?;
        }
        w.report_trouble().await?;
        Ok(w)
    }

    async fn serve(&mut self) -> Result<(), RegistryError> {
        let mut tick = tokio::time::interval(self.inner.list_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            let grace_ends = self.grace.deadline();
            tokio::select! {
                () = self.inbox.wait() => self.on_inbox().await?,
                _ = tick.tick(), if self.lister.is_none() => {
                    self.lister = Some(tokio::spawn(list(
                        Arc::clone(&self.inner),
                        self.listing.clone(),
                        self.listed_namespaces(),
                        self.callers(),
                        self.known(),
                    )));
                }
                done = async { self.lister.as_mut().expect("guarded").await }, if self.lister.is_some() => {
                    self.lister = None;
                    let listed = done.map_err(|e| RegistryError::Unavailable(format!("the service listing stopped: {e}")))?;
                    let changed = self.apply_listing(listed).await?;
                    self.send_changes(changed).await?;
                    self.report_trouble().await?;
                }
                () = sleep_until(grace_ends), if grace_ends.is_some() => {
                    let held = self.grace.end();
                    self.send_changes(held).await?;
                }
            }
        }
    }

    /// Opens namespace `ns`'s session.
    async fn open(&mut self, ns: &str) -> Result<(), RegistryError> {
        self.inner.stats.request("connect");
        let session = Session::open(&self.inner.connect(), ns, Arc::clone(&self.inbox)).await?;
        self.sessions.insert(ns.to_string(), session);
        Ok(())
    }

    /// The namespaces a listing reads: `None` when it lists them itself.
    fn listed_namespaces(&self) -> Option<Vec<String>> {
        (!self.lists_namespaces).then(|| self.sessions.keys().cloned().collect())
    }

    fn callers(&self) -> BTreeMap<String, Caller> {
        self.sessions
            .iter()
            .map(|(ns, s)| (ns.clone(), s.caller().clone()))
            .collect()
    }

    /// The services subscribed to, by namespace.
    fn known(&self) -> BTreeMap<String, BTreeSet<Name>> {
        let mut out: BTreeMap<String, BTreeSet<Name>> = BTreeMap::new();
        for id in self.infos.keys() {
            out.entry(id.namespace.clone())
                .or_default()
                .insert((id.group.clone(), id.name.clone()));
        }
        out
    }

    /// Takes in a listing: sessions for new namespaces, subscriptions for new services, removed
    /// ones dropped, names given again. The services whose state may have changed.
    async fn apply_listing(&mut self, listed: Listed) -> Result<Vec<ServiceId>, RegistryError> {
        let mut changed = Vec::new();
        let before = std::mem::take(&mut self.trouble);
        match listed.namespaces {
            Some(Ok(namespaces)) => {
                let now: BTreeSet<String> = namespaces.into_iter().collect();
                let gone: Vec<String> = self
                    .sessions
                    .keys()
                    .filter(|ns| !now.contains(*ns))
                    .cloned()
                    .collect();
                for ns in gone {
                    tracing::info!(namespace = %ns, "Nacos namespace gone; its services are removed.");
                    self.sessions.remove(&ns);
                    let ids: Vec<ServiceId> = self
                        .infos
                        .keys()
                        .filter(|id| id.namespace == ns)
                        .cloned()
                        .collect();
                    changed.extend(self.drop_services(ids).await);
                }
                for ns in now {
                    if !self.sessions.contains_key(&ns) {
                        tracing::info!(namespace = %ns, "New Nacos namespace; subscribing to its services.");
                        self.open(&ns).await?;
                    }
                }
            }
            Some(Err(e)) => {
                self.trouble.insert("namespaces".to_string(), e);
            }
            None => {}
        }
        let mut new = Vec::new();
        for (ns, result) in listed.services {
            if !self.sessions.contains_key(&ns) {
                continue;
            }
            let names = match result {
                Ok(n) => n,
                Err(e) => {
                    let what = format!("namespace {ns}");
                    // Said once, not at every listing while it lasts (/registryz keeps saying).
                    if before.get(&what).map(ToString::to_string) != Some(e.to_string()) {
                        tracing::warn!(namespace = %ns, error = %e, "Listing a Nacos namespace failed; its services are kept as they are.");
                    }
                    self.trouble.insert(what, e);
                    continue;
                }
            };
            let gone: Vec<ServiceId> = self
                .infos
                .keys()
                .filter(|id| {
                    id.namespace == ns && !names.contains(&(id.group.clone(), id.name.clone()))
                })
                .cloned()
                .collect();
            changed.extend(self.drop_services(gone).await);
            new.extend(
                names
                    .into_iter()
                    .map(|(g, n)| ServiceId::new(&ns, &g, &n))
                    .filter(|id| !self.infos.contains_key(id)),
            );
        }
        // A subscription refused before is asked for again with the new ones (unless its
        // service or namespace has gone meanwhile).
        let retried = std::mem::take(&mut self.refused);
        for id in retried.into_keys() {
            if !new.contains(&id) && self.sessions.contains_key(&id.namespace) {
                new.push(id);
            }
        }
        changed.extend(self.subscribe(new).await?);
        let names = Names::assign(self.infos.keys());
        changed.extend(names.changed(&self.names).cloned());
        if names.problems() != self.names.problems() {
            let ev = self
                .inner
                .memory()
                .ledger
                .update(names::SCOPE, names.problems().to_vec());
            if let Some(ev) = ev {
                self.tx.send(ev).await?;
            }
        }
        self.names = names;
        self.inner.stats.subscriptions(self.infos.len());
        Ok(changed)
    }

    /// Subscribes to `ids`, several at once; the ones subscribed. A refusal is trouble for that
    /// service only; a connection that fails ends the watch.
    async fn subscribe(&mut self, ids: Vec<ServiceId>) -> Result<Vec<ServiceId>, RegistryError> {
        let calls = ids.into_iter().filter_map(|id| {
            let caller = self.sessions.get(&id.namespace)?.caller().clone();
            let inner = Arc::clone(&self.inner);
            Some(async move {
                inner.stats.request("subscribe");
                let answer = inner
                    .with_token(|t| {
                        let caller = caller.clone();
                        let (g, n) = (id.group.clone(), id.name.clone());
                        async move { caller.subscribe(&g, &n, t.as_ref()).await }
                    })
                    .await;
                (id, answer)
            })
        });
        let answers: Vec<(ServiceId, Result<ServiceInfo, RegistryError>)> =
            futures::stream::iter(calls)
                .buffer_unordered(SUBSCRIBE_CONCURRENCY)
                .collect()
                .await;
        let mut done = Vec::new();
        for (id, answer) in answers {
            match answer {
                Ok(info) => {
                    tracing::info!(service = %id, "Subscribed to a Nacos service.");
                    self.infos.insert(id.clone(), info);
                    done.push(id);
                }
                Err(e @ (RegistryError::Unauthorized(_) | RegistryError::BadResponse(_))) => {
                    tracing::warn!(service = %id, error = %e, "Nacos refused a subscription; the service is left out until it is granted.");
                    self.refused.insert(id, e);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    /// Ends the subscriptions to `ids` (they left the registry or their namespace did).
    async fn drop_services(&mut self, ids: Vec<ServiceId>) -> Vec<ServiceId> {
        for id in &ids {
            self.infos.remove(id);
            self.forget_unreadable(id);
            if let Some(s) = self.sessions.get(&id.namespace) {
                self.inner.stats.request("unsubscribe");
                let token = self.inner.token().await.ok().flatten();
                if let Err(e) = s
                    .caller()
                    .unsubscribe(&id.group, &id.name, token.as_ref())
                    .await
                {
                    tracing::debug!(service = %id, error = %e, "Unsubscribing failed (the subscription ends with the connection).");
                }
            }
            tracing::info!(service = %id, "Nacos service gone.");
        }
        ids
    }

    /// What to serve for `id` now (through the grace), and its conversion's problems.
    fn evaluate(&mut self, id: &ServiceId) -> (Option<Service>, Vec<String>) {
        let (now, problems) = match (self.infos.get(id), self.names.get(id)) {
            (Some(info), Some(name)) => {
                let c = convert_service(id, name, info);
                (c.service, c.problems)
            }
            _ => (None, Vec::new()),
        };
        (self.grace.serve(id, now), problems)
    }

    /// Evaluates `ids` again and sends what changed as one event (and their problems).
    async fn send_changes(&mut self, ids: Vec<ServiceId>) -> Result<(), RegistryError> {
        let mut upserts = Vec::new();
        let mut removes: Vec<ServiceKey> = Vec::new();
        let ids: BTreeSet<ServiceId> = ids.into_iter().collect();
        for id in ids {
            let (served, problems) = self.evaluate(&id);
            let ev = self.inner.memory().ledger.update(&scope(&id), problems);
            if let Some(ev) = ev {
                self.tx.send(ev).await?;
            }
            match served {
                Some(s) => {
                    let old = self.sent.get(&id);
                    if old == Some(&s) {
                        continue;
                    }
                    if let Some(old) = old.filter(|o| o.key != s.key) {
                        removes.push(old.key.clone());
                    }
                    self.sent.insert(id, s.clone());
                    upserts.push(s);
                }
                None => {
                    if let Some(old) = self.sent.remove(&id) {
                        removes.push(old.key);
                    }
                }
            }
        }
        if upserts.is_empty() && removes.is_empty() {
            return Ok(());
        }
        self.tx
            .send(RegistryEvent::Changes { upserts, removes })
            .await
    }

    /// Takes what the sessions left: pushes applied, unreadable ones reported and their
    /// services read again, a lost connection ending the watch.
    async fn on_inbox(&mut self) -> Result<(), RegistryError> {
        let taken = self.inbox.take();
        self.inner.stats.pushes(taken.received);
        if let Some((ns, reason)) = taken.lost {
            return Err(RegistryError::Unavailable(format!(
                "the Nacos connection for namespace {ns:?} ended: {reason}"
            )));
        }
        let mut changed = Vec::new();
        for ((ns, group, name), info) in taken.pushes {
            let id = ServiceId::new(&ns, &group, &name);
            let Some(slot) = self.infos.get_mut(&id) else {
                tracing::debug!(service = %id, "Push for a service not subscribed to; ignored.");
                continue;
            };
            *slot = info;
            if self.forget_unreadable(&id) {
                self.send_unreadable(&ns).await?;
            }
            changed.push(id);
        }
        let mut again = Vec::new();
        for (ns, bad) in taken.unreadable {
            self.inner.stats.unreadable();
            tracing::warn!(namespace = %ns, service = ?bad.service, error = %bad.error, "A push from Nacos could not be read; acknowledged, and the service is read again.");
            self.unreadable
                .entry(ns.clone())
                .or_default()
                .insert(describe_push(&bad), unreadable_line(&ns, &bad));
            self.send_unreadable(&ns).await?;
            if let Some((g, n)) = &bad.service {
                let id = ServiceId::new(&ns, g, n);
                if self.infos.contains_key(&id) {
                    again.push(id);
                }
            }
        }
        // Read again by subscribing again: the answer is the service's whole list now (until
        // then its last readable list stays).
        for id in self.subscribe(again).await? {
            changed.push(id.clone());
            if self.forget_unreadable(&id) {
                self.send_unreadable(&id.namespace).await?;
            }
        }
        self.send_changes(changed).await?;
        self.report_trouble().await
    }

    /// Forgets an unreadable push of `id` (a later one was read); whether there was one.
    fn forget_unreadable(&mut self, id: &ServiceId) -> bool {
        let key = format!("{}/{}", id.group, id.name);
        self.unreadable
            .get_mut(&id.namespace)
            .is_some_and(|m| m.remove(&key).is_some())
    }

    async fn send_unreadable(&mut self, ns: &str) -> Result<(), RegistryError> {
        let lines: Vec<String> = self
            .unreadable
            .get(ns)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default();
        let ev = self
            .inner
            .memory()
            .ledger
            .update(&format!("nacos namespace {ns} pushes"), lines);
        match ev {
            Some(ev) => self.tx.send(ev).await,
            None => Ok(()),
        }
    }

    /// Reports what fails for one part only, when that changed: the registry unhealthy with
    /// every failure named, or healthy again.
    async fn report_trouble(&mut self) -> Result<(), RegistryError> {
        let failures: Vec<(String, &RegistryError)> = self
            .trouble
            .iter()
            .map(|(what, e)| (what.clone(), e))
            .chain(
                self.refused
                    .iter()
                    .map(|(id, e)| (format!("subscription to {id}"), e)),
            )
            .collect();
        let now = (!failures.is_empty()).then(|| {
            failures
                .iter()
                .map(|(what, e)| format!("{what}: {e}"))
                .collect::<Vec<_>>()
                .join("; ")
        });
        if now == self.reported {
            return Ok(());
        }
        let event = match (&now, failures.first().map(|(_, e)| *e)) {
            (Some(text), Some(first)) => RegistryEvent::Retrying(match first {
                RegistryError::Unauthorized(_) => RegistryError::Unauthorized(text.clone()),
                RegistryError::BadResponse(_) => RegistryError::BadResponse(text.clone()),
                _ => RegistryError::Unavailable(text.clone()),
            }),
            _ => RegistryEvent::Recovered,
        };
        self.reported = now;
        self.tx.send(event).await
    }
}

/// The listing API of an HTTP listing (only asked when namespaces are listed over HTTP).
fn api(listing: &Listing) -> ListingApi {
    match listing {
        Listing::Http(api) => *api,
        Listing::Grpc { .. } => ListingApi::Console,
    }
}

/// `group/name` of an unreadable push's service, or what stands for an unnamed one.
fn describe_push(bad: &UnreadablePush) -> String {
    bad.service
        .as_ref()
        .map_or_else(|| "(unnamed)".to_string(), |(g, n)| format!("{g}/{n}"))
}

fn unreadable_line(ns: &str, bad: &UnreadablePush) -> String {
    format!(
        "nacos namespace {ns}: a push of service {} could not be read ({}); it was acknowledged and the service is read again",
        describe_push(bad),
        mcp_core::clip::clip(&bad.error, 200)
    )
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// One listing round: the namespaces (unless `namespaces` gives them) and each namespace's
/// services, filtered. `known` is what the watch has, so that a service missing from one read is
/// confirmed by another before it is dropped.
async fn list(
    inner: Arc<Inner>,
    listing: Listing,
    namespaces: Option<Vec<String>>,
    callers: BTreeMap<String, Caller>,
    known: BTreeMap<String, BTreeSet<Name>>,
) -> Listed {
    let mut out = Listed::default();
    let namespaces = match namespaces {
        Some(given) => given,
        None => match inner.http.namespaces(api(&listing)).await {
            Ok(ns) => {
                out.namespaces = Some(Ok(ns.clone()));
                ns
            }
            Err(e) => {
                out.namespaces = Some(Err(e.into()));
                // Keep listing what the watch has.
                callers.keys().cloned().collect()
            }
        },
    };
    let empty = BTreeSet::new();
    for ns in namespaces {
        let known = known.get(&ns).unwrap_or(&empty);
        let result = match &listing {
            Listing::Http(api) => {
                let api = *api;
                let http = &inner.http;
                catalog::list_namespace(known, |page| {
                    http.services_page(api, &ns, page, catalog::PAGE_SIZE)
                })
                .await
                .map_err(RegistryError::from)
            }
            Listing::Grpc { groups } => match callers.get(&ns) {
                Some(caller) => list_groups(&inner, caller, groups, known).await,
                // A namespace without a session yet: listed once it has one.
                None => Ok(known.clone()),
            },
        };
        let result = result.map(|names| {
            names
                .into_iter()
                .filter(|(g, n)| inner.wants(g, n))
                .collect()
        });
        out.services.insert(ns, result);
    }
    out
}

/// The services of `groups` in the caller's namespace, over gRPC.
async fn list_groups(
    inner: &Inner,
    caller: &Caller,
    groups: &[String],
    known: &BTreeSet<Name>,
) -> Result<BTreeSet<Name>, RegistryError> {
    let mut all = BTreeSet::new();
    for group in groups {
        let known_here: BTreeSet<Name> =
            known.iter().filter(|(g, _)| g == group).cloned().collect();
        let names = inner
            .with_token(|token| {
                let known_here = &known_here;
                async move {
                    catalog::list_namespace(known_here, |page| {
                        let token = token.clone();
                        async move {
                            inner.stats.request("catalog");
                            let p = caller
                                .list_group(group, page, catalog::PAGE_SIZE, token.as_ref())
                                .await?;
                            Ok::<_, crate::session::SessionError>(crate::http::Page {
                                count: p.count,
                                names: p
                                    .service_names
                                    .into_iter()
                                    .map(|n| (group.clone(), n))
                                    .collect(),
                            })
                        }
                    })
                    .await
                }
            })
            .await?;
        all.extend(names);
    }
    Ok(all)
}
