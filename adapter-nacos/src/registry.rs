//! The watch: Nacos 2.x's own client protocol, one gRPC session per namespace.
//!
//! A watch logs in (when credentials are set), lists the namespaces (unless given), reads each
//! namespace's catalog (service names, every group), subscribes to each service that passes the
//! filters and sends the whole state as one `Reset`. After that the server pushes a service's
//! instance list whenever it changes; only that service is converted and sent, and only when
//! its conversion changed. Every `--service-list-interval` the catalog is read again (names
//! only, one request per namespace): new services are subscribed to, removed ones dropped, in
//! one `Changes` event. Nothing is ever re-listed while nothing changes.
//!
//! A session that ends (the server went away, restarted, asked for a reset) ends the watch:
//! the core keeps the last good state, reports the outage on /readyz, /registryz and in
//! metrics, backs off and starts a new watch, on the next server when several are given. A new
//! watch that finds no instance at all where some were served is held back for
//! `--startup-grace`: a restarted Nacos has lost its ephemeral instances until their clients
//! register again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::stream::BoxStream;
use mcp_core::filter::NameFilter;
use mcp_core::problems::ProblemLedger;
use mcp_core::vip::VipCidr;
use mcp_core::{channel_stream, EventSender, Registry, RegistryError, RegistryEvent, Service};
use mcp_runtime::secret::Secret;
use tokio::sync::mpsc;

use crate::config::NacosConfig;
use crate::convert::{convert_service, ServiceId};
use crate::dto::{split_grouped, ServiceInfo, DEFAULT_GROUP};
use crate::http::{HttpClient, HttpClientError};
use crate::session::{GrpcTls, Session, SessionError, SessionEvent};
use crate::stats::NacosStats;

/// Why the registry cannot be built from the settings.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The client settings are unusable.
    #[error(transparent)]
    Client(#[from] HttpClientError),
    /// The metrics could not be made.
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// Nacos as a [`Registry`].
#[derive(Clone, Debug)]
pub struct NacosRegistry {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    http: HttpClient,
    tls: GrpcTls,
    timeout: Duration,
    list_every: Duration,
    grace: Duration,
    /// Namespace ids to watch; empty: every one the server lists.
    namespaces: Vec<String>,
    groups: NameFilter,
    services: NameFilter,
    stats: NacosStats,
    /// Survives watches: what the core holds.
    memory: Mutex<Memory>,
}

/// What outlives one watch, because the core keeps it across watches too.
#[derive(Debug, Default)]
struct Memory {
    /// Whether the last state sent had any endpoint.
    served_instances: bool,
    /// Problems as the core holds them (kept across watches), so a new watch clears scopes
    /// that went away.
    ledger: ProblemLedger,
}

impl NacosRegistry {
    /// A registry from the flags.
    pub fn new(cfg: &NacosConfig) -> Result<Self, SetupError> {
        let stats = NacosStats::new()?;
        Ok(Self {
            inner: Arc::new(Inner {
                http: HttpClient::new(cfg, stats.clone())?,
                tls: GrpcTls {
                    ca: cfg.tls.ca.clone(),
                    identity: cfg.tls.client_cert.clone().zip(cfg.tls.client_key.clone()),
                },
                timeout: cfg.timeout,
                list_every: cfg.service_list(),
                grace: cfg.startup_grace,
                namespaces: cfg.namespace_ids(),
                groups: cfg.groups.filter(),
                services: cfg.services.filter(),
                stats,
                memory: Mutex::new(Memory::default()),
            }),
        })
    }
}

impl Registry for NacosRegistry {
    const NAME: &'static str = "nacos";
    const DEFAULT_HOST_SUFFIX: &'static str = "nacos";
    const DEFAULT_NAMESPACE: &'static str = "nacos";
    const DEFAULT_VIP_CIDR: VipCidr = VipCidr::range(242, 6, 0, 0, 16);

    fn watch(&self) -> BoxStream<'static, Result<RegistryEvent, RegistryError>> {
        let inner = Arc::clone(&self.inner);
        channel_stream(move |tx| async move {
            let result = inner.run(tx).await;
            if result.is_err() {
                inner.http.next_server();
            }
            result
        })
    }

    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        self.inner.stats.collectors()
    }
}

/// One watch's view.
struct Watch {
    sessions: BTreeMap<String, Session>,
    /// The last instance list of every subscribed service.
    infos: BTreeMap<ServiceId, ServiceInfo>,
    /// What was sent for each.
    sent: BTreeMap<ServiceId, Service>,
    events: mpsc::Sender<SessionEvent>,
    /// Since when an empty registry is held back (`--startup-grace`).
    held_since: Option<Instant>,
}

impl Inner {
    async fn run(&self, tx: EventSender) -> Result<(), RegistryError> {
        let (events, mut pushes) = mpsc::channel(1024);
        let mut w = Watch {
            sessions: BTreeMap::new(),
            infos: BTreeMap::new(),
            sent: BTreeMap::new(),
            events,
            held_since: None,
        };
        let token = self.token().await?;
        for ns in self.namespace_ids().await? {
            self.open(&mut w, &ns).await?;
            for (group, name) in self.catalog(&ns).await? {
                self.subscribe(&mut w, ServiceId::new(&ns, &group, &name), token.as_ref())
                    .await?;
            }
        }
        self.reset_or_hold(&mut w, &tx).await?;

        let mut relist = tokio::time::interval(self.list_every);
        relist.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        relist.tick().await;
        loop {
            tokio::select! {
                ev = pushes.recv() => match ev {
                    Some(SessionEvent::Push { namespace, info }) => {
                        self.stats.push();
                        self.on_push(&mut w, &namespace, info, &tx).await?;
                    }
                    Some(SessionEvent::Lost { namespace, reason }) => {
                        return Err(RegistryError::Unavailable(format!(
                            "the Nacos connection for namespace {:?} ended: {reason}",
                            shown(&namespace)
                        )));
                    }
                    None => return Err(RegistryError::Ended),
                },
                _ = relist.tick() => self.relist(&mut w, &tx).await?,
            }
        }
    }

    async fn token(&self) -> Result<Option<Secret>, RegistryError> {
        Ok(self.http.token().await?)
    }

    /// The namespaces to watch now.
    async fn namespace_ids(&self) -> Result<Vec<String>, RegistryError> {
        if !self.namespaces.is_empty() {
            return Ok(self.namespaces.clone());
        }
        Ok(self.http.namespaces().await?)
    }

    /// The services of `ns` the filters let through.
    async fn catalog(&self, ns: &str) -> Result<Vec<(String, String)>, RegistryError> {
        let all = self.http.catalog(ns).await?;
        Ok(all
            .into_iter()
            .filter(|(g, n)| self.groups.allows(g) && self.services.allows(n))
            .collect())
    }

    async fn open(&self, w: &mut Watch, ns: &str) -> Result<(), RegistryError> {
        self.stats.request("connect");
        let session = Session::open(
            self.http.server(),
            &self.tls,
            ns,
            self.timeout,
            w.events.clone(),
        )
        .await?;
        w.sessions.insert(ns.to_string(), session);
        Ok(())
    }

    async fn subscribe(
        &self,
        w: &mut Watch,
        id: ServiceId,
        token: Option<&Secret>,
    ) -> Result<(), RegistryError> {
        let Some(session) = w.sessions.get_mut(&id.namespace) else {
            return Ok(());
        };
        self.stats.request("subscribe");
        let info = match session.subscribe(&id.group, &id.name, token).await {
            Err(SessionError::Refused { .. }) if token.is_some() => {
                // As for HTTP: the token ran out or the server has not taken it in yet; log in
                // again and ask once more.
                self.http.drop_token();
                tokio::time::sleep(crate::http::RELOGIN_PAUSE).await;
                let fresh = self.http.token().await?;
                self.stats.request("subscribe");
                session.subscribe(&id.group, &id.name, fresh.as_ref()).await
            }
            other => other,
        }
        .inspect_err(|_| self.http.drop_token())?;
        w.infos.insert(id, info);
        self.stats.subscriptions(w.infos.len());
        Ok(())
    }

    /// Sends the whole state, unless it is empty where instances were served and the startup
    /// grace has not run out (then the core keeps the last state and says why).
    async fn reset_or_hold(&self, w: &mut Watch, tx: &EventSender) -> Result<(), RegistryError> {
        let mut problems = BTreeMap::new();
        let mut sent = BTreeMap::new();
        for (id, info) in &w.infos {
            let c = convert_service(id, info);
            if !c.problems.is_empty() {
                problems.insert(scope(id), c.problems);
            }
            if let Some(s) = c.service {
                sent.insert(id.clone(), s);
            }
        }
        let instances = endpoints(&sent);
        let served = self.memory().served_instances;
        if instances == 0 && served {
            let since = *w.held_since.get_or_insert_with(Instant::now);
            if since.elapsed() < self.grace {
                if since.elapsed().is_zero() || w.sent.is_empty() {
                    tracing::warn!(
                        server = %self.http.server().http,
                        grace = ?self.grace,
                        "Nacos answered with no instance where instances were served; holding the last state during the startup grace"
                    );
                }
                tx.send(RegistryEvent::Retrying(RegistryError::Unavailable(format!(
                    "Nacos at {} came back with no instance; the last state is kept for up to {:?} while clients register again",
                    self.http.server().http,
                    self.grace
                ))))
                .await?;
                return Ok(());
            }
        }
        w.held_since = None;
        tracing::info!(
            server = %self.http.server().http,
            namespaces = w.sessions.len(),
            services = sent.len(),
            instances,
            "Read Nacos."
        );
        w.sent = sent;
        tx.send(RegistryEvent::Reset(w.sent.values().cloned().collect()))
            .await?;
        let events = {
            let mut m = self.memory();
            m.served_instances = instances > 0;
            m.ledger.replace_all(problems)
        };
        for ev in events {
            tx.send(ev).await?;
        }
        Ok(())
    }

    async fn on_push(
        &self,
        w: &mut Watch,
        ns: &str,
        info: ServiceInfo,
        tx: &EventSender,
    ) -> Result<(), RegistryError> {
        let raw_name = info.name.clone().unwrap_or_default();
        let group = info
            .group_name
            .clone()
            .filter(|g| !g.is_empty())
            .unwrap_or_else(|| DEFAULT_GROUP.to_string());
        let (group, name) = split_grouped(&raw_name, &group);
        let id = ServiceId::new(ns, group, name);
        let Some(slot) = w.infos.get_mut(&id) else {
            tracing::debug!(service = %id, "Push for a service not subscribed to; ignored.");
            return Ok(());
        };
        *slot = info;
        if w.held_since.is_some() {
            return self.reset_or_hold(w, tx).await;
        }
        let change = self.converted(w, &id);
        if let Some(s) = change.upsert {
            tracing::debug!(service = %id, "Service changed.");
            tx.send(RegistryEvent::Upsert(s)).await?;
        }
        if let Some(p) = change.problems {
            tx.send(p).await?;
        }
        self.memory().served_instances = endpoints(&w.sent) > 0;
        Ok(())
    }

    /// Converts `id` again and updates `w.sent`: the service when it changed, and the problem
    /// report when that changed.
    fn converted(&self, w: &mut Watch, id: &ServiceId) -> Change {
        let Some(info) = w.infos.get(id) else {
            return Change::default();
        };
        let c = convert_service(id, info);
        let problems = self.memory().ledger.update(&scope(id), c.problems);
        let upsert = c.service.filter(|s| w.sent.get(id) != Some(s));
        if let Some(s) = &upsert {
            w.sent.insert(id.clone(), s.clone());
        }
        Change { upsert, problems }
    }

    /// Reads the catalogs again: subscribes to new services, drops removed ones (and new or
    /// removed namespaces when all are watched), all sent as one change.
    async fn relist(&self, w: &mut Watch, tx: &EventSender) -> Result<(), RegistryError> {
        let token = self.token().await?;
        let namespaces: BTreeSet<String> = self.namespace_ids().await?.into_iter().collect();
        let mut upserts = Vec::new();
        let mut removes = Vec::new();
        let gone_ns: Vec<String> = w
            .sessions
            .keys()
            .filter(|ns| !namespaces.contains(*ns))
            .cloned()
            .collect();
        for ns in &gone_ns {
            w.sessions.remove(ns);
            tracing::info!(
                namespace = shown(ns),
                "Nacos namespace gone; its services are removed."
            );
        }
        let mut wanted: BTreeSet<ServiceId> = BTreeSet::new();
        for ns in &namespaces {
            if !w.sessions.contains_key(ns) {
                tracing::info!(
                    namespace = shown(ns),
                    "New Nacos namespace; subscribing to its services."
                );
                self.open(w, ns).await?;
            }
            for (group, name) in self.catalog(ns).await? {
                wanted.insert(ServiceId::new(ns, &group, &name));
            }
        }
        let gone: Vec<ServiceId> = w
            .infos
            .keys()
            .filter(|id| !wanted.contains(*id))
            .cloned()
            .collect();
        for id in gone {
            w.infos.remove(&id);
            if let Some(session) = w.sessions.get_mut(&id.namespace) {
                self.stats.request("unsubscribe");
                if let Err(e) = session
                    .unsubscribe(&id.group, &id.name, token.as_ref())
                    .await
                {
                    tracing::debug!(service = %id, error = %e, "Unsubscribing failed (the subscription ends with the connection).");
                }
            }
            if let Some(s) = w.sent.remove(&id) {
                removes.push(s.key);
            }
            let cleared = self.memory().ledger.update(&scope(&id), Vec::new());
            if let Some(ev) = cleared {
                tx.send(ev).await?;
            }
            tracing::info!(service = %id, "Nacos service gone.");
        }
        self.stats.subscriptions(w.infos.len());
        for id in wanted {
            if w.infos.contains_key(&id) {
                continue;
            }
            tracing::info!(service = %id, "New Nacos service; subscribing.");
            self.subscribe(w, id.clone(), token.as_ref()).await?;
            if w.held_since.is_none() {
                let change = self.converted(w, &id);
                upserts.extend(change.upsert);
                if let Some(p) = change.problems {
                    tx.send(p).await?;
                }
            }
        }
        if w.held_since.is_some() {
            return self.reset_or_hold(w, tx).await;
        }
        if !upserts.is_empty() || !removes.is_empty() {
            tx.send(RegistryEvent::Changes { upserts, removes }).await?;
            self.memory().served_instances = endpoints(&w.sent) > 0;
        }
        Ok(())
    }

    fn memory(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.memory.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What converting one service again changed.
#[derive(Default)]
struct Change {
    upsert: Option<Service>,
    problems: Option<RegistryEvent>,
}

/// Endpoints across `sent`.
fn endpoints(sent: &BTreeMap<ServiceId, Service>) -> usize {
    sent.values().map(|s| s.endpoints.len()).sum()
}

/// Problem scope of a service.
fn scope(id: &ServiceId) -> String {
    format!("nacos service {id}")
}

/// A namespace id as people read it.
fn shown(ns: &str) -> &str {
    if ns.is_empty() {
        "public"
    } else {
        ns
    }
}
