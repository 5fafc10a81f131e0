//! The watch: Eureka's own client protocol, made push-shaped.
//!
//! One full `GET /apps`, then `GET /apps/delta` every `--refresh-interval`. A delta is applied to
//! the local copy and the result checked against the server's `apps__hashcode`; a mismatch, a
//! delta without a hashcode, or a delta from another server than the last answer (each server
//! has its own delta queue) means a full fetch. Only apps a delta touched are converted and sent,
//! so an unchanged registry costs one small request per interval and nothing else.
//!
//! Every server failing ends the watch (the core keeps the last good state, backs off and calls
//! `watch` again, which starts with a full fetch). A full fetch that finds nothing where
//! something was served is held back for `--startup-grace`: that is what a restarted server or
//! a switch to a server that has not caught up looks like, and its clients re-register within a
//! heartbeat or two. Deltas that delete everything are believed at once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::stream::BoxStream;
use mcp_core::filter::NameFilter;
use mcp_core::problems::ProblemLedger;
use mcp_core::vip::VipCidr;
use mcp_core::{
    channel_stream, EventSender, Registry, RegistryError, RegistryEvent, Service, ServiceKey,
};

use crate::client::{Answer, Client, ClientError};
use crate::config::EurekaConfig;
use crate::convert::convert_app;
use crate::state::LocalRegistry;

/// Why the registry cannot be built from the settings.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The client settings are unusable.
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// Eureka as a [`Registry`].
#[derive(Clone, Debug)]
pub struct EurekaRegistry {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    client: Client,
    refresh: Duration,
    grace: Duration,
    filter: NameFilter,
    /// Survives watches: what the core holds.
    memory: Mutex<Memory>,
}

/// What outlives one watch, because the core keeps it across watches too.
#[derive(Debug, Default)]
struct Memory {
    /// Whether the last state sent had any instance.
    served_instances: bool,
    /// Since when full fetches have come back empty while something was served.
    empty_since: Option<Instant>,
    /// Problems as the core holds them (it keeps them across watches; a `Reset` does not clear
    /// them), so a new watch clears scopes that went away.
    ledger: ProblemLedger,
}

impl EurekaRegistry {
    /// A registry from the flags.
    pub fn new(cfg: &EurekaConfig) -> Result<Self, SetupError> {
        Ok(Self {
            inner: Arc::new(Inner {
                client: Client::new(cfg)?,
                refresh: cfg.refresh(),
                grace: cfg.startup_grace,
                filter: cfg.filter(),
                memory: Mutex::new(Memory::default()),
            }),
        })
    }
}

impl Registry for EurekaRegistry {
    const NAME: &'static str = "eureka";
    const DEFAULT_HOST_SUFFIX: &'static str = "eureka";
    const DEFAULT_NAMESPACE: &'static str = "eureka";
    const DEFAULT_VIP_CIDR: VipCidr = VipCidr::range(242, 4, 0, 0, 16);

    fn watch(&self) -> BoxStream<'static, Result<RegistryEvent, RegistryError>> {
        let inner = Arc::clone(&self.inner);
        channel_stream(move |tx| async move { inner.run(tx).await })
    }
}

/// One watch's view: the local copy, which server it came from, what was sent per app.
struct Watch {
    local: LocalRegistry,
    server: usize,
    sent: BTreeMap<String, Service>,
    /// The server answered a delta with 403 (logged once per watch).
    delta_refused: bool,
}

impl Inner {
    async fn run(&self, tx: EventSender) -> Result<(), RegistryError> {
        let answer = self.full_fetch().await?;
        let mut w = Watch {
            local: LocalRegistry::default(),
            server: answer.server,
            sent: BTreeMap::new(),
            delta_refused: false,
        };
        self.reset(&mut w, answer, &tx).await?;
        loop {
            tokio::time::sleep(self.refresh).await;
            let delta = match self.client.delta().await {
                Ok(d) => d,
                // A server with `eureka.server.disable-delta=true` answers the delta with 403
                // (while `/apps` works): it is read with full fetches; the core's content hash
                // keeps an unchanged one from being pushed.
                Err(ClientError::Unauthorized { status: 403, .. }) => {
                    if !w.delta_refused {
                        tracing::info!(
                            server = %self.client.base(w.server),
                            "Eureka refuses deltas (disable-delta?); reading the full registry every interval"
                        );
                        w.delta_refused = true;
                    }
                    let answer = self.full_fetch().await?;
                    self.reset(&mut w, answer, &tx).await?;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let reason = if delta.server != w.server {
                Some("server switch")
            } else {
                match delta.apps.apps_hashcode.clone() {
                    None => {
                        tracing::info!("delta without apps__hashcode; full fetch");
                        Some("delta without apps__hashcode")
                    }
                    Some(hash) => {
                        if delta.apps.application.is_empty() && w.local.reconcile_hash() == hash {
                            continue;
                        }
                        let touched = w.local.apply_delta(delta.apps);
                        let local = w.local.reconcile_hash();
                        if local == hash {
                            self.send_apps(&mut w, touched, &tx).await?;
                            None
                        } else {
                            tracing::info!(local = %local, server = %hash, "hashcode mismatch after delta; full fetch");
                            Some("hashcode mismatch")
                        }
                    }
                }
            };
            if let Some(reason) = reason {
                tracing::debug!(reason, "delta not usable; fetching the full registry");
                let answer = self.full_fetch().await?;
                self.reset(&mut w, answer, &tx).await?;
            }
        }
    }

    /// `GET /apps`, repeated while it is an empty registry that the startup grace holds back.
    async fn full_fetch(&self) -> Result<Answer, RegistryError> {
        loop {
            let answer = self.client.full().await.map_err(RegistryError::from)?;
            let empty = answer
                .apps
                .application
                .iter()
                .all(|a| a.instance.is_empty());
            let hold = {
                let mut m = self.memory();
                if empty && m.served_instances {
                    let since = *m.empty_since.get_or_insert_with(Instant::now);
                    since.elapsed() < self.grace
                } else {
                    m.empty_since = None;
                    false
                }
            };
            if !hold {
                return Ok(answer);
            }
            tracing::warn!(
                server = %self.client.base(answer.server),
                grace = ?self.grace,
                "Eureka answered an empty registry where instances were served; holding the last state during the startup grace"
            );
            tokio::time::sleep(self.refresh).await;
        }
    }

    /// Replaces the watch's state with a full fetch and sends it as a `Reset`.
    async fn reset(
        &self,
        w: &mut Watch,
        answer: Answer,
        tx: &EventSender,
    ) -> Result<(), RegistryError> {
        w.local = LocalRegistry::from_full(answer.apps);
        w.server = answer.server;
        w.sent.clear();
        let mut problems = BTreeMap::new();
        let names: Vec<String> = w.local.app_names().cloned().collect();
        for name in names.iter().filter(|n| self.allows(n)) {
            let Some(insts) = w.local.app(name) else {
                continue;
            };
            let c = convert_app(name, insts);
            if !c.problems.is_empty() {
                problems.insert(scope(name), c.problems);
            }
            if let Some(s) = c.service {
                w.sent.insert(name.clone(), s);
            }
        }
        // Info for the fetches that mean something (a new watch, a switch, a mismatch); a
        // server that refuses deltas would otherwise log one every interval.
        if w.delta_refused {
            tracing::debug!(apps = w.sent.len(), "full fetch");
        } else {
            tracing::info!(
                server = %self.client.base(w.server),
                apps = w.sent.len(),
                instances = w.local.instance_count(),
                "full fetch"
            );
        }
        tx.send(RegistryEvent::Reset(w.sent.values().cloned().collect()))
            .await?;
        let events = {
            let mut m = self.memory();
            m.served_instances = w.local.instance_count() > 0;
            m.ledger.replace_all(problems)
        };
        for ev in events {
            tx.send(ev).await?;
        }
        Ok(())
    }

    /// Sends what changed in the apps a delta touched.
    async fn send_apps(
        &self,
        w: &mut Watch,
        touched: BTreeSet<String>,
        tx: &EventSender,
    ) -> Result<(), RegistryError> {
        for name in touched.iter().filter(|n| self.allows(n)) {
            let c = match w.local.app(name) {
                Some(insts) => convert_app(name, insts),
                None => Default::default(),
            };
            let event = match (c.service, w.sent.get(name)) {
                (Some(s), Some(old)) if *old == s => None,
                (Some(s), _) => {
                    w.sent.insert(name.clone(), s.clone());
                    Some(RegistryEvent::Upsert(s))
                }
                (None, Some(_)) => {
                    w.sent.remove(name);
                    Some(RegistryEvent::Remove(ServiceKey::new(name.to_lowercase())))
                }
                (None, None) => None,
            };
            if let Some(ev) = event {
                tracing::debug!(app = %name, "app changed");
                tx.send(ev).await?;
            }
            let ev = self.memory().ledger.update(&scope(name), c.problems);
            if let Some(ev) = ev {
                tx.send(ev).await?;
            }
        }
        self.memory().served_instances = w.local.instance_count() > 0;
        Ok(())
    }

    fn allows(&self, app: &str) -> bool {
        self.filter.allows(&app.to_lowercase())
    }

    fn memory(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.memory.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Problem scope of an app.
fn scope(app: &str) -> String {
    format!("eureka app {app}")
}
