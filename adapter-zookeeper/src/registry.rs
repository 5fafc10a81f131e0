//! Watches ZooKeeper.
//!
//! ZooKeeper watches are one-shot hints, and `zookeeper-async` loses them silently on every
//! reconnect (it never sends `SetWatches`, so the server it reconnects to knows none of them)
//! and opens a new session silently after expiry. So the watcher applies each fired watch at
//! once, arms every watch again after a reconnect, and checks what it read now and then:
//!
//! * one client is shared by every `watch()` call; a state listener records each transition
//!   and each session expiry; it is rebuilt (resolving the ensemble again) after a terminal
//!   state or when the ensemble resolves to other addresses (see [`crate::client`]);
//! * a watch starts by waiting for a connected session, adding digest auth, listing every root
//!   and service directory (arming child and data watches) and sending one `Reset`;
//! * every watch is armed with the plain `watch` flag, and the client's default watcher routes
//!   each event to the running watch (see [`crate::client`]): watcher objects would pile up
//!   inside the client library, one more per unchanged znode at every re-arm;
//! * a fired watch is applied at once with what re-arming it returns: the children of a Dubbo
//!   `providers` directory are its providers (one request, nothing else read), the children of
//!   a Curator directory its instances (data read for new ones only), an instance's data that
//!   instance; a root's children its service directories (new ones read whole). Only the
//!   services that changed are sent (`Upsert`/`Remove`). Watches that fired meanwhile are
//!   applied in the same pass; nothing waits for more (the core coalesces bursts,
//!   `--coalesce`);
//! * a lost connection (a leader election, a server restart) is ridden out: the client
//!   reconnects by itself on the same session, and for up to the session timeout nothing is
//!   reported, the last state is served, and a request cut short by it ends only the pass it
//!   was in. Connected again on the same session, the watch adds auth again and re-arms
//!   every watch (a check with `rearm`, [`crate::session`]): directories are listed again
//!   (a child watch is armed only so), instances get an `exists` and are read only if their
//!   stat changed, and only what changed is sent (nothing, usually);
//! * down longer than the session timeout, the registry is reported unreachable
//!   (`Retrying`: `/registryz` 503, `mcp_adapter_registry_retries_total`) while the last good
//!   state is served; `Recovered` once the same session is back. A session the server expired
//!   ends the watch (`Unavailable`): the next one lists everything again with a `Reset`;
//! * a safety pass runs every `--resync-interval` (default 5 min): one `exists` per watched
//!   znode, compared with the stat it had when read, reading again only what changed (a watch
//!   lost some other way); it sends nothing when nothing changed;
//! * AuthFailed, a closed session or a request that times out ends the watch.
//!
//! This file is the watch: the client's session and the loop that picks the next pass. The
//! passes (full list, check, fired watches) and what they send are [`crate::session`]; the
//! registry's state is held once, per service directory, in [`crate::model`] (which also works
//! out what a change sends); the requests that read ZooKeeper and arm its watches are
//! [`crate::reads`].

use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use mcp_core::{channel_stream, EventSender, Registry, RegistryError, RegistryEvent};
use mcp_runtime::secret::{Secret, SecretSource};
use tokio::sync::mpsc;
use tokio::time::{timeout, Instant};
use zookeeper_async::ZkState;

use crate::client::{is_terminal, Client, Clients};
use crate::config::{DubboDiscovery, Layout, ZookeeperConfig};
use crate::filter::Filters;
use crate::model::Model;
use crate::session::Session;
use crate::watches::{Hint, Stamping};

/// How soon a pass cut short by a lost connection is done again when no state transition says
/// the connection is back (a fallback: the client has always reported one so far).
const RETRY_PASS: Duration = Duration::from_secs(1);
/// Longest a new watch waits for a connected session before failing.
const CONNECT_WAIT: Duration = Duration::from_secs(10);

/// Why the adapter cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The digest credentials could not be read.
    #[error("cannot read --zk-digest-file {path}: {error}")]
    DigestFile {
        /// The file.
        path: String,
        /// Why.
        error: std::io::Error,
    },
    /// The digest credentials are not `user:password`.
    #[error("digest credentials must be user:password")]
    Digest,
    /// No root to read.
    #[error("no root path to read")]
    NoRoot,
}

/// Digest credentials are `user:password` with a user.
pub(crate) fn check_digest(d: &Secret) -> Result<(), ConfigError> {
    match d.expose().split_once(':') {
        Some((user, _)) if !user.is_empty() => Ok(()),
        _ => Err(ConfigError::Digest),
    }
}

/// ZooKeeper as a watched registry.
#[derive(Clone)]
pub struct ZookeeperRegistry {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ZookeeperRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZookeeperRegistry")
            .field("servers", &self.inner.servers)
            .field("roots", &self.inner.roots)
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner {
    pub(crate) servers: String,
    pub(crate) request_timeout: Duration,
    /// How long the connection may be down before the registry is reported unreachable.
    pub(crate) session_timeout: Duration,
    pub(crate) resync: Duration,
    pub(crate) concurrency: usize,
    pub(crate) digest: SecretSource,
    pub(crate) roots: Vec<(String, Layout)>,
    pub(crate) filters: Filters,
    pub(crate) discovery: DubboDiscovery,
    pub(crate) clients: Clients,
    /// The registry as the last watch knew it, handed to the next one: which of two colliding
    /// interfaces keeps the plain name, the ports of empty services and hidden Dubbo 3
    /// registrations must survive a reconnect, not only changes within one watch.
    pub(crate) model: std::sync::Mutex<Model>,
}

impl ZookeeperRegistry {
    /// Builds the registry; digest credentials come from `--zk-digest-file` (re-read when it
    /// changes: a new session uses the rotated credentials) or `ZK_DIGEST`.
    pub fn new(cfg: &ZookeeperConfig) -> Result<Self, ConfigError> {
        let digest = SecretSource::new(
            "digest",
            cfg.zk_digest_file.as_deref(),
            std::env::var("ZK_DIGEST").ok(),
        )
        .map_err(|e| ConfigError::DigestFile {
            path: e.path.display().to_string(),
            error: e.source,
        })?;
        if let Some(d) = digest.current().ok().flatten() {
            check_digest(&d)?;
        }
        let roots = cfg.roots();
        if roots.is_empty() {
            return Err(ConfigError::NoRoot);
        }
        Ok(Self {
            inner: Arc::new(Inner {
                servers: cfg.zk_servers.clone(),
                request_timeout: cfg.zk_request_timeout.max(Duration::from_millis(100)),
                session_timeout: cfg.zk_session_timeout,
                resync: cfg.resync_interval.max(Duration::from_secs(1)),
                concurrency: cfg.zk_concurrency.max(1),
                digest,
                roots,
                filters: Filters::new(cfg),
                discovery: cfg.dubbo_discovery,
                clients: Clients::new(cfg.zk_servers.clone(), cfg.zk_session_timeout),
                model: std::sync::Mutex::new(Model::default()),
            }),
        })
    }
}

impl Registry for ZookeeperRegistry {
    const NAME: &'static str = "zookeeper";
    const DEFAULT_HOST_SUFFIX: &'static str = "zookeeper";
    const DEFAULT_NAMESPACE: &'static str = "zookeeper";
    const DEFAULT_VIP_CIDR: mcp_core::vip::VipCidr =
        mcp_core::vip::VipCidr::range(242, 3, 0, 0, 16);

    fn watch(&self) -> BoxStream<'static, Result<RegistryEvent, RegistryError>> {
        let inner = Arc::clone(&self.inner);
        channel_stream(move |tx| async move { inner.watch(tx).await })
    }
}

fn is_connected(s: ZkState) -> bool {
    matches!(s, ZkState::Connected | ZkState::ConnectedReadOnly)
}

impl Inner {
    /// Waits until the shared client has a connected session.
    async fn wait_connected(&self, client: &mut Client) -> Result<(), RegistryError> {
        let deadline = Instant::now() + CONNECT_WAIT;
        loop {
            let seen = *client.state.borrow_and_update();
            let state = seen.state;
            if is_connected(state) {
                return Ok(());
            }
            if seen.transitions == 0 {
                // The Connected transition may have happened before the listener was added:
                // a request that succeeds proves the session.
                let probe = timeout(Duration::from_secs(1), client.zk.exists("/", false)).await;
                if matches!(probe, Ok(Ok(_))) {
                    return Ok(());
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(RegistryError::Unavailable(format!(
                    "no ZooKeeper session with {} (state {state:?})",
                    self.servers
                )));
            }
            let _ = timeout(left.min(Duration::from_millis(500)), client.state.changed()).await;
        }
    }

    async fn watch(self: Arc<Self>, tx: EventSender) -> Result<(), RegistryError> {
        let mut client = self.clients.get().await?;
        if let Err(e) = self.wait_connected(&mut client).await {
            if is_terminal(client.state.borrow().state) {
                self.clients
                    .discard("no session and the state is terminal")
                    .await;
            }
            return Err(e);
        }
        let (hint_tx, mut hints) = mpsc::unbounded_channel();
        client.route_to(hint_tx);
        let model = self
            .model
            .lock()
            .map(|mut m| std::mem::take(&mut *m))
            .unwrap_or_default();
        let mut s = Session::new(&self, Arc::clone(&client.zk), model);
        let mut seen = *client.state.borrow_and_update();
        s.reader.stamping = Stamping::Before;
        let t = Instant::now();
        let listed = s.full_list(&tx, true).await;
        s.reader.stamping = Stamping::Forget;
        let mut interrupted = false;
        if let Err(e) = listed {
            // Lost the connection while listing: listed again (whole, with a `Reset`) by the
            // next watch, once connected.
            s.reader.take_interrupted();
            return Err(e);
        }
        let n = s.reader.counts();
        tracing::info!(
            servers = %self.servers,
            services = s.model.served.len(),
            directories = s.model.states.len(),
            exists = n.exists,
            lists = n.lists,
            data = n.data,
            bytes = n.bytes,
            took = ?t.elapsed(),
            "Listed ZooKeeper."
        );

        let mut resync = tokio::time::interval_at(Instant::now() + self.resync, self.resync);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Since when the connection is down (`None`: connected).
        let mut down_since: Option<Instant> = None;
        // Whether the core was told the registry is unreachable (`Retrying`).
        let mut reported = false;
        loop {
            let grace = async {
                match down_since {
                    Some(t) if !reported => {
                        tokio::time::sleep_until(t + self.session_timeout).await;
                    }
                    _ => std::future::pending().await,
                }
            };
            // A pass cut short by a lost connection is done again once connected; this is the
            // fallback should no transition come (it always has so far).
            let retry = async {
                if interrupted && down_since.is_none() {
                    tokio::time::sleep(RETRY_PASS).await;
                } else {
                    std::future::pending::<()>().await;
                }
            };
            let pass = tokio::select! {
                changed = client.state.changed() => {
                    if changed.is_err() {
                        self.clients.discard("its IO task stopped").await;
                        return Err(RegistryError::Unavailable("ZooKeeper client stopped".into()));
                    }
                    let now = *client.state.borrow_and_update();
                    if now.transitions == seen.transitions {
                        continue;
                    }
                    let expired = now.expired != seen.expired;
                    seen = now;
                    if expired {
                        // The client has opened a new session by now, with no watches: the
                        // next watch lists everything again and sends a `Reset`.
                        return Err(RegistryError::Unavailable(format!(
                            "the ZooKeeper session with {} expired",
                            self.servers
                        )));
                    } else if is_connected(now.state) {
                        if let Some(t) = down_since.take() {
                            tracing::info!(
                                down = ?t.elapsed(),
                                "ZooKeeper connected again on the same session; re-arming watches."
                            );
                        }
                        Pass::Rearm
                    } else if now.state == ZkState::AuthFailed {
                        self.clients.discard("ZooKeeper refused the digest credentials").await;
                        return Err(RegistryError::Unauthorized(
                            "ZooKeeper refused the digest credentials".into(),
                        ));
                    } else if is_terminal(now.state) {
                        self.clients.discard("the session was closed").await;
                        return Err(RegistryError::Unavailable(format!(
                            "the ZooKeeper session with {} was closed",
                            self.servers
                        )));
                    } else {
                        if down_since.is_none() {
                            tracing::info!(
                                state = ?now.state,
                                grace = ?self.session_timeout,
                                "Lost the ZooKeeper connection; serving on while the client reconnects within the session timeout."
                            );
                            down_since = Some(Instant::now());
                        }
                        Pass::None
                    }
                }
                () = grace => {
                    // The session is as good as expired: say so, keep serving, and keep waiting
                    // (the same session, should it come back, is re-armed; a new one re-lists).
                    reported = true;
                    tx.send(RegistryEvent::Retrying(RegistryError::Unavailable(format!(
                        "no ZooKeeper connection to {} for more than the session timeout ({:?})",
                        self.servers, self.session_timeout
                    ))))
                    .await?;
                    Pass::None
                }
                () = retry => Pass::Rearm,
                _ = resync.tick() => {
                    if down_since.is_none() { Pass::Safety } else { Pass::None }
                }
                hint = hints.recv() => {
                    let Some(Hint(first)) = hint else {
                        return Err(RegistryError::Ended);
                    };
                    // Whatever else has fired by now goes into the same pass; nothing waits for
                    // more (bursts are the core's to coalesce, `--coalesce`).
                    let mut fired = vec![first];
                    while let Ok(Hint(k)) = hints.try_recv() {
                        fired.push(k);
                    }
                    if down_since.is_none() {
                        Pass::Fired(fired)
                    } else {
                        // Checked anyway once connected again.
                        for k in fired {
                            s.reader.disarm(&k);
                        }
                        Pass::None
                    }
                }
            };
            let rearm = matches!(pass, Pass::Rearm);
            let result = match pass {
                Pass::None => continue,
                Pass::Rearm => s.check(&tx, true).await,
                Pass::Safety => s.check(&tx, false).await,
                Pass::Fired(fired) => {
                    let t = Instant::now();
                    let watches = fired.len();
                    let r = s.apply_fired(&tx, fired, Vec::new()).await;
                    tracing::debug!(watches, took = ?t.elapsed(), "Applied fired watches.");
                    r.map(|_| ())
                }
            };
            match result {
                Ok(()) => {
                    if rearm {
                        interrupted = false;
                    }
                    if reported && down_since.is_none() {
                        reported = false;
                        tx.send(RegistryEvent::Recovered).await?;
                    }
                }
                Err(e) if s.reader.take_interrupted() => {
                    tracing::info!(error = %e, "A ZooKeeper request lost its connection; re-arming once connected again.");
                    interrupted = true;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// What the session loop does next.
enum Pass {
    /// Nothing.
    None,
    /// Check every watched znode and arm every watch again (connected again, or a pass was cut
    /// short by a lost connection).
    Rearm,
    /// The safety pass: check every watched znode.
    Safety,
    /// Apply fired watches.
    Fired(Vec<String>),
}
