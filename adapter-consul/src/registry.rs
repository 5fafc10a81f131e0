//! Watches Consul: a blocking query on the catalog for the set of services, and one blocking
//! query per service on `/v1/health/service/:name` for its instances.
//!
//! A watch starts with a full list (fetched with bounded concurrency) sent as one `Reset`, then
//! each change arrives as an `Upsert` or `Remove` of one service. Any failure (Consul down, 5xx,
//! ACL denial) ends the watch with an error: the core keeps serving the last good state, marks
//! the source unhealthy, backs off and starts a new watch, which re-lists everything.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, BoxStream, StreamExt};
use mcp_core::{
    channel_stream, EventSender, Registry, RegistryError, RegistryEvent, Service, ServiceKey,
};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::client::{ConsulClient, ConsulError, Indexed};
use crate::config::ConsulConfig;
use crate::convert::{convert, glob_match, ConvertSettings, HealthEntry};

/// Rate limit of one watcher's queries (Consul's advice for blocking-query loops): a burst of
/// [`BURST`] queries, then one per [`REFILL`]. An isolated change is fetched at once; a service
/// that changes all the time degrades to polling every 50 ms instead of spinning.
const BURST: u32 = 3;
const REFILL: Duration = Duration::from_millis(50);

/// Token bucket for one watcher.
#[derive(Debug)]
struct RateLimit {
    tokens: u32,
    last: tokio::time::Instant,
}

impl RateLimit {
    fn new() -> Self {
        Self {
            tokens: BURST,
            last: tokio::time::Instant::now(),
        }
    }

    /// Waits until a query may be sent.
    async fn acquire(&mut self) {
        let now = tokio::time::Instant::now();
        let earned = (now.duration_since(self.last).as_millis() / REFILL.as_millis()) as u32;
        if earned > 0 {
            self.tokens = (self.tokens + earned).min(BURST);
            self.last = now;
        }
        if self.tokens == 0 {
            tokio::time::sleep_until(self.last + REFILL).await;
            self.last += REFILL;
            self.tokens = 1;
        }
        self.tokens -= 1;
    }
}

/// Why the adapter cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Bad Consul settings.
    #[error(transparent)]
    Consul(#[from] ConsulError),
    /// Bad conversion settings.
    #[error("{0}")]
    Convert(String),
}

/// Consul as a watched registry.
#[derive(Clone, Debug)]
pub struct ConsulRegistry {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    client: ConsulClient,
    settings: ConvertSettings,
    include: Vec<String>,
    exclude: Vec<String>,
    concurrency: usize,
    /// Services with problems reported, across watches: a re-list clears those of services
    /// that vanished meanwhile.
    reported: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl ConsulRegistry {
    /// Builds the registry; the ACL token comes from `CONSUL_HTTP_TOKEN` or `--consul-token-file`.
    pub fn new(cfg: &ConsulConfig) -> Result<Self, ConfigError> {
        let token = std::env::var("CONSUL_HTTP_TOKEN").ok();
        Self::with_token(cfg, token)
    }

    /// Builds the registry with an explicit token (tests).
    pub fn with_token(cfg: &ConsulConfig, token: Option<String>) -> Result<Self, ConfigError> {
        Ok(Self {
            inner: Arc::new(Inner {
                client: ConsulClient::new(cfg, token)?,
                settings: ConvertSettings::new(cfg).map_err(ConfigError::Convert)?,
                include: cfg.services.clone(),
                exclude: cfg.exclude_services.clone(),
                concurrency: cfg.concurrency.max(1),
                reported: Default::default(),
            }),
        })
    }
}

impl Registry for ConsulRegistry {
    const NAME: &'static str = "consul";
    const DEFAULT_HOST_SUFFIX: &'static str = "service.consul";
    const DEFAULT_NAMESPACE: &'static str = "consul";

    fn watch(&self) -> BoxStream<'static, Result<RegistryEvent, RegistryError>> {
        let inner = Arc::clone(&self.inner);
        channel_stream(move |tx| async move { inner.watch(tx).await.map_err(RegistryError::from) })
    }
}

/// One service's first listing.
type HealthResult = Result<Indexed<Vec<HealthEntry>>, ConsulError>;

enum Msg {
    Catalog(Indexed<BTreeMap<String, Vec<String>>>),
    Health(String, Indexed<Vec<HealthEntry>>),
    Failed(ConsulError),
}

impl Inner {
    fn wanted(&self, name: &str) -> bool {
        (self.include.is_empty() || self.include.iter().any(|p| glob_match(p, name)))
            && !self.exclude.iter().any(|p| glob_match(p, name))
    }

    /// Converts one service and reports its skipped instances; `None` = do not serve it.
    async fn convert(
        &self,
        tx: &EventSender,
        name: &str,
        entries: &[HealthEntry],
    ) -> Result<Option<Service>, RegistryError> {
        let c = convert(name, entries, &self.settings);
        for p in &c.problems {
            tracing::warn!(service = %name, problem = %p, "Skipped part of a Consul service.");
        }
        self.report(tx, name, c.problems).await?;
        Ok(c.service)
    }

    /// Sends a service's problems when it has some, or had some before (to clear them).
    async fn report(
        &self,
        tx: &EventSender,
        name: &str,
        problems: Vec<String>,
    ) -> Result<(), RegistryError> {
        let send = {
            let mut reported = self.reported.lock().unwrap_or_else(|p| p.into_inner());
            if problems.is_empty() {
                reported.remove(name)
            } else {
                reported.insert(name.to_string());
                true
            }
        };
        if send {
            tx.send(RegistryEvent::Problems {
                scope: format!("consul service {name}"),
                problems,
            })
            .await?;
        }
        Ok(())
    }

    async fn watch(self: Arc<Self>, tx: EventSender) -> Result<(), ConsulError> {
        let catalog = self.client.services(None).await?;
        let names: Vec<String> = catalog
            .value
            .keys()
            .filter(|n| self.wanted(n))
            .cloned()
            .collect();
        tracing::info!(addr = %self.client.addr(), services = names.len(), "Listing Consul services.");
        let lists: Vec<(String, HealthResult)> = stream::iter(names)
            .map(|name| {
                let client = self.client.clone();
                async move {
                    let r = client.health(&name, None).await;
                    (name, r)
                }
            })
            .buffer_unordered(self.concurrency)
            .collect()
            .await;

        let (msg_tx, mut msgs) = mpsc::channel::<Msg>(1024);
        // Dropping the set (when this function returns) stops every watcher.
        let mut watchers: JoinSet<()> = JoinSet::new();
        let mut handles: HashMap<String, tokio::task::AbortHandle> = HashMap::new();
        let mut services = Vec::new();
        let mut served: HashMap<String, bool> = HashMap::new();
        for (name, result) in lists {
            let list = result?;
            let svc = self
                .convert(&tx, &name, &list.value)
                .await
                .map_err(|_| ended())?;
            served.insert(name.clone(), svc.is_some());
            services.extend(svc);
            let h = watchers.spawn(watch_health(
                self.client.clone(),
                name.clone(),
                list.index,
                msg_tx.clone(),
            ));
            handles.insert(name, h);
        }
        tx.send(RegistryEvent::Reset(services))
            .await
            .map_err(|_| ended())?;
        let stale: Vec<String> = {
            let reported = self.reported.lock().unwrap_or_else(|p| p.into_inner());
            reported
                .iter()
                .filter(|n| !handles.contains_key(*n))
                .cloned()
                .collect()
        };
        for name in stale {
            self.report(&tx, &name, Vec::new())
                .await
                .map_err(|_| ended())?;
        }
        watchers.spawn(watch_catalog(
            self.client.clone(),
            catalog.index,
            msg_tx.clone(),
        ));

        while let Some(msg) = msgs.recv().await {
            match msg {
                Msg::Failed(e) => return Err(e),
                Msg::Catalog(c) => {
                    let now: Vec<&String> = c.value.keys().filter(|n| self.wanted(n)).collect();
                    for name in &now {
                        if !handles.contains_key(*name) {
                            tracing::info!(service = %name, "Consul service appeared.");
                            let h = watchers.spawn(watch_health(
                                self.client.clone(),
                                (*name).clone(),
                                0,
                                msg_tx.clone(),
                            ));
                            handles.insert((*name).clone(), h);
                        }
                    }
                    let gone: Vec<String> = handles
                        .keys()
                        .filter(|n| !now.contains(n))
                        .cloned()
                        .collect();
                    for name in gone {
                        tracing::info!(service = %name, "Consul service vanished.");
                        if let Some(h) = handles.remove(&name) {
                            h.abort();
                        }
                        if served.remove(&name) == Some(true) {
                            tx.send(RegistryEvent::Remove(ServiceKey::new(name.clone())))
                                .await
                                .map_err(|_| ended())?;
                        }
                        self.report(&tx, &name, Vec::new())
                            .await
                            .map_err(|_| ended())?;
                    }
                }
                Msg::Health(name, list) => {
                    if !handles.contains_key(&name) {
                        continue;
                    }
                    let svc = self
                        .convert(&tx, &name, &list.value)
                        .await
                        .map_err(|_| ended())?;
                    match svc {
                        Some(s) => {
                            served.insert(name, true);
                            tx.send(RegistryEvent::Upsert(s))
                                .await
                                .map_err(|_| ended())?;
                        }
                        None => {
                            if served.insert(name.clone(), false) == Some(true) {
                                tx.send(RegistryEvent::Remove(ServiceKey::new(name)))
                                    .await
                                    .map_err(|_| ended())?;
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

fn ended() -> ConsulError {
    ConsulError::Config("watch dropped".into())
}

/// Follows Consul's index rules for one blocking query; returns the index to use next and
/// whether the answer may carry a change.
fn next_index(previous: u64, returned: u64) -> (u64, bool) {
    if returned < previous {
        // Index went backwards (snapshot restore, restart): start over without blocking.
        (0, true)
    } else {
        (returned, returned != previous)
    }
}

async fn watch_health(client: ConsulClient, name: String, mut index: u64, tx: mpsc::Sender<Msg>) {
    let mut limit = RateLimit::new();
    loop {
        limit.acquire().await;
        match client.health(&name, Some(index)).await {
            Ok(list) => {
                tracing::debug!(service = %name, index = list.index, "Consul answered a blocking query.");
                let (next, changed) = next_index(index, list.index);
                index = next;
                if changed && tx.send(Msg::Health(name.clone(), list)).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                let _ = tx.send(Msg::Failed(e)).await;
                return;
            }
        }
    }
}

async fn watch_catalog(client: ConsulClient, mut index: u64, tx: mpsc::Sender<Msg>) {
    let mut limit = RateLimit::new();
    loop {
        limit.acquire().await;
        match client.services(Some(index)).await {
            Ok(c) => {
                let (next, changed) = next_index(index, c.index);
                index = next;
                if changed && tx.send(Msg::Catalog(c)).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                let _ = tx.send(Msg::Failed(e)).await;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn rate_limit_allows_a_burst_then_one_per_refill() {
        let mut l = RateLimit::new();
        let t0 = tokio::time::Instant::now();
        for _ in 0..BURST {
            l.acquire().await;
        }
        assert_eq!(t0.elapsed(), Duration::ZERO, "a burst goes at once");
        l.acquire().await;
        assert_eq!(t0.elapsed(), REFILL);
        l.acquire().await;
        assert_eq!(t0.elapsed(), REFILL * 2);
        tokio::time::sleep(REFILL * 10).await;
        let t1 = tokio::time::Instant::now();
        l.acquire().await;
        assert_eq!(t1.elapsed(), Duration::ZERO, "refilled after a quiet spell");
    }

    #[test]
    fn index_rules() {
        assert_eq!(next_index(10, 10), (10, false), "a return without a change");
        assert_eq!(next_index(10, 12), (12, true));
        assert_eq!(next_index(10, 3), (0, true), "backwards: reset to 0");
        assert_eq!(next_index(0, 7), (7, true));
    }
}
