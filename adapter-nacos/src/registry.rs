//! Nacos as a [`Registry`]: the settings a watch runs with, what outlives one watch, and the
//! calls every part of a watch shares (a login, a gRPC call with its token).
//!
//! A watch ([`crate::watch`]) speaks Nacos 2.x's own client protocol, which 3.x serves too:
//! one gRPC session per namespace, a subscription per service, the server pushing each
//! service's instances when they change. A session that ends ends the watch: the core keeps the
//! last good state, reports the outage on /readyz, /registryz and in metrics, backs off and
//! starts a new watch, on the next server when several are given.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::BoxStream;
use mcp_core::filter::NameFilter;
use mcp_core::problems::ProblemLedger;
use mcp_core::vip::VipCidr;
use mcp_core::{channel_stream, Registry, RegistryError, RegistryEvent, Service};
use mcp_runtime::secret::Secret;

use crate::config::NacosConfig;
use crate::convert::ServiceId;
use crate::http::{HttpClient, HttpClientError, RELOGIN_PAUSE};
use crate::session::{Connect, GrpcTls, SessionError};
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

/// What every watch runs with.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) http: HttpClient,
    tls: GrpcTls,
    timeout: Duration,
    max_message: usize,
    pub(crate) list_every: Duration,
    pub(crate) grace: Duration,
    /// Namespace ids to watch; empty: every one the server lists.
    pub(crate) namespaces: Vec<String>,
    /// `--group` as given: what a gRPC listing reads.
    pub(crate) group_allow: Vec<String>,
    groups: NameFilter,
    services: NameFilter,
    dubbo_consumers: bool,
    pub(crate) stats: NacosStats,
    /// Survives watches: what the core holds.
    memory: Mutex<Memory>,
}

/// What outlives one watch, because the core keeps it across watches too.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    /// What was sent for each service: the state the core serves.
    pub(crate) sent: BTreeMap<ServiceId, Service>,
    /// Problems as the core holds them (kept across watches), so a new watch clears scopes
    /// that went away.
    pub(crate) ledger: ProblemLedger,
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
                max_message: usize::try_from(cfg.response.max_response_size).unwrap_or(usize::MAX),
                list_every: cfg.service_list(),
                grace: cfg.startup_grace,
                namespaces: cfg.namespace_ids(),
                group_allow: cfg.groups.allow.clone(),
                groups: cfg.groups.filter(),
                services: cfg.services.filter(),
                dubbo_consumers: cfg.dubbo_consumers,
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
    const NAME_PARTS: &'static [&'static str] = &["service", "group", "namespace"];

    fn watch(&self) -> BoxStream<'static, Result<RegistryEvent, RegistryError>> {
        let inner = Arc::clone(&self.inner);
        channel_stream(move |tx| async move {
            let result = crate::watch::run(Arc::clone(&inner), tx).await;
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

impl Inner {
    /// Whether the filters let `group`/`name` through. Dubbo's `consumers:*` entries (a
    /// consumer's own registration, port 0: never a destination) only with
    /// `--dubbo-consumers`.
    pub(crate) fn wants(&self, group: &str, name: &str) -> bool {
        self.groups.allows(group)
            && self.services.allows(name)
            && (self.dubbo_consumers || !name.starts_with("consumers:"))
    }

    /// How sessions connect to the server in use.
    pub(crate) fn connect(&self) -> Connect<'_> {
        Connect {
            server: self.http.server(),
            tls: &self.tls,
            timeout: self.timeout,
            max_message: self.max_message,
        }
    }

    /// The access token to send now (none without credentials).
    pub(crate) async fn token(&self) -> Result<Option<Secret>, RegistryError> {
        Ok(self.http.token().await?)
    }

    /// `call` with the current token; when the server refuses it (it ran out, or a restarted
    /// server does not know it), once more after a new login.
    pub(crate) async fn with_token<T, F, Fut>(&self, call: F) -> Result<T, RegistryError>
    where
        F: Fn(Option<Secret>) -> Fut,
        Fut: Future<Output = Result<T, SessionError>>,
    {
        let token = self.token().await?;
        let had = token.is_some();
        match call(token).await {
            Err(SessionError::Refused { .. }) if had => {
                self.http.drop_token();
                tokio::time::sleep(RELOGIN_PAUSE).await;
                let fresh = self.token().await?;
                call(fresh).await.map_err(|e| {
                    self.http.drop_token();
                    e.into()
                })
            }
            other => other.map_err(Into::into),
        }
    }

    pub(crate) fn memory(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.memory.lock().unwrap_or_else(|p| p.into_inner())
    }
}
