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
//!   every watch ([`Session::check`] with `rearm`): directories are listed again (a child
//!   watch is armed only so), instances get an `exists` and are read only if their stat
//!   changed, and only what changed is sent (nothing, usually);
//! * down longer than the session timeout, the registry is reported unreachable
//!   (`Retrying`: `/registryz` 503, `mcp_adapter_registry_retries_total`) while the last good
//!   state is served; `Recovered` once the same session is back. A session the server expired
//!   ends the watch (`Unavailable`): the next one lists everything again with a `Reset`;
//! * a safety pass runs every `--resync-interval` (default 5 min): one `exists` per watched
//!   znode, compared with the stat it had when read, reading again only what changed (a watch
//!   lost some other way); it sends nothing when nothing changed;
//! * AuthFailed, a closed session or a request that times out ends the watch.
//!
//! This file is the watch: the session, the loop and what it sends. The registry's state is
//! held once, per service directory, in [`crate::model`] (which also works out what a change
//! sends); the requests that read ZooKeeper and arm its watches are [`crate::reads`].

use mcp_runtime::secret::{Secret, SecretSource};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use mcp_core::problems::ProblemLedger;
use mcp_core::{channel_stream, EventSender, Registry, RegistryError, RegistryEvent};
use tokio::sync::mpsc;
use tokio::time::{timeout, Instant};
use zookeeper_async::ZkState;

use crate::client::{is_terminal, Client, Clients};
use crate::config::{DubboDiscovery, Layout, ZookeeperConfig};
use crate::filter::Filters;
use crate::model::{join, Dir, Held, Model, Read};
use crate::reads::{child_key, data_key, Hint, Reader, Stamping};

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
fn check_digest(d: &Secret) -> Result<(), ConfigError> {
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

struct Inner {
    servers: String,
    request_timeout: Duration,
    /// How long the connection may be down before the registry is reported unreachable.
    session_timeout: Duration,
    resync: Duration,
    concurrency: usize,
    digest: SecretSource,
    roots: Vec<(String, Layout)>,
    filters: Filters,
    discovery: DubboDiscovery,
    clients: Clients,
    /// The registry as the last watch knew it, handed to the next one: which of two colliding
    /// interfaces keeps the plain name, the ports of empty services and hidden Dubbo 3
    /// registrations must survive a reconnect, not only changes within one watch.
    model: std::sync::Mutex<Model>,
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

/// What a fired watch on a path points at.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    Root(String, Layout),
    Dir(Dir),
}

/// The root or service directory a watched path belongs to (the longest matching root).
fn target(roots: &[(String, Layout)], path: &str) -> Option<Target> {
    let (root, layout) = roots
        .iter()
        .filter(|(r, _)| {
            path == r
                || path
                    .strip_prefix(r.as_str())
                    .is_some_and(|rest| rest.starts_with('/') || r == "/")
        })
        .max_by_key(|(r, _)| r.len())?;
    if path == root {
        return Some(Target::Root(root.clone(), *layout));
    }
    let rest = path.get(root.len()..)?.trim_start_matches('/');
    let name = rest.split('/').next().filter(|n| !n.is_empty())?;
    Some(Target::Dir(Dir {
        root: root.clone(),
        name: name.to_string(),
        layout: *layout,
    }))
}

/// Per-watch state: what is armed, the registry as known, what was sent.
struct Session<'a> {
    inner: &'a Inner,
    /// Reads ZooKeeper for this watch; holds the watches it armed.
    reader: Reader<'a>,
    /// Taken from [`Inner::model`] for this watch, handed back when it ends.
    model: Model,
    /// Root-level problems (scope -> problems).
    root_problems: BTreeMap<String, Vec<String>>,
    /// Problems last sent per scope (only changes are sent again).
    sent_problems: ProblemLedger,
    /// Problems from the last assembly (renamed interfaces, duplicate names), per scope.
    assembly_problems: BTreeMap<String, Vec<String>>,
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
        let mut s = Session {
            inner: &self,
            reader: Reader::new(
                Arc::clone(&client.zk),
                self.request_timeout,
                self.concurrency,
                &self.filters,
            ),
            model,
            root_problems: BTreeMap::new(),
            sent_problems: ProblemLedger::new(),
            assembly_problems: BTreeMap::new(),
        };
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

impl Drop for Session<'_> {
    /// Hands the registry as known to the next watch (see [`Inner::model`]).
    fn drop(&mut self) {
        if let Ok(mut m) = self.inner.model.lock() {
            *m = std::mem::take(&mut self.model);
        }
    }
}

impl Session<'_> {
    /// Lists a root's service directories into the model, and its problems.
    async fn list_root(&mut self, root: &str, layout: Layout) -> Result<(), RegistryError> {
        let (dirs, problems) = self.reader.list_root(root, layout).await?;
        self.root_problems
            .insert(format!("zookeeper {root}"), problems);
        self.model.dirs.insert(root.to_string(), dirs);
        Ok(())
    }

    /// Adds the digest credentials, if any, to the session (again after a reconnect: the
    /// client does not re-send them).
    async fn auth(&mut self) -> Result<(), RegistryError> {
        let digest = self.inner.digest.current().map_err(|e| {
            RegistryError::Unavailable(format!("cannot read --zk-digest-file: {e}"))
        })?;
        if let Some(d) = digest {
            check_digest(&d).map_err(|e| RegistryError::Unauthorized(e.to_string()))?;
            self.reader.add_auth(d.expose()).await?;
        }
        Ok(())
    }

    /// The watch keys of every znode the model was read from: each root and directory (child
    /// watches), each Dubbo `providers` directory, each Curator instance (data watches). A
    /// Dubbo interface's own directory is left out when it has a `providers` directory: its
    /// other children (`consumers`, `routers`) change nothing served, and its deletion shows in
    /// its root's stamp.
    fn watched(&self) -> Vec<String> {
        let mut keys = BTreeSet::new();
        for (root, _) in &self.inner.roots {
            keys.insert(child_key(root));
        }
        for dir in self.model.dirs.values().flatten() {
            let providers = self
                .model
                .states
                .get(dir)
                .is_some_and(|st| st.held == Held::Providers);
            if !providers {
                keys.insert(child_key(&dir.path()));
            }
        }
        for (dir, st) in &self.model.states {
            let path = dir.path();
            match &st.held {
                Held::Nothing => {
                    keys.insert(child_key(&path));
                }
                Held::Providers => {
                    keys.insert(child_key(&join(&path, "providers")));
                }
                Held::Instances(m) => {
                    keys.insert(child_key(&path));
                    keys.extend(m.keys().map(|id| data_key(&join(&path, id))));
                }
            }
        }
        keys.into_iter().collect()
    }

    /// Checks every watched znode against what was read (one `exists` each) and reads again
    /// what changed, sending only what that changes. With `rearm` (connected again on the same
    /// session: the client has lost every watch) every watch is armed again; directories are
    /// listed again (that is how a child watch is armed), instances are read only if changed.
    async fn check(&mut self, tx: &EventSender, rearm: bool) -> Result<(), RegistryError> {
        let t = Instant::now();
        let before = self.reader.counts();
        if rearm {
            self.auth().await?;
            self.reader.disarm_all();
        }
        let keys = self.watched();
        let watched = keys.len();
        let fired = self.reader.check(keys, rearm).await;
        let fired = match fired {
            Ok(f) => f,
            Err(e) => {
                self.reader.end_check();
                return Err(e);
            }
        };
        let changed = fired.len();
        // Directories whose creation could not be read yet (who keeps a contested name or VIP
        // depends on it): tried again at every check, one `exists` each.
        let undated: Vec<Dir> = self
            .model
            .states
            .iter()
            .filter(|(_, st)| !st.dated())
            .map(|(d, _)| d.clone())
            .collect();
        // The directories that changed were stamped by the check, before they are listed.
        self.reader.stamping = Stamping::Keep;
        let sent = if fired.is_empty() && undated.is_empty() {
            Ok(0)
        } else {
            self.apply_fired(tx, fired, undated).await
        };
        self.reader.stamping = Stamping::Forget;
        self.reader.end_check();
        let sent = sent?;
        let n = self.reader.counts() - before;
        let pass = if rearm { "re-arm" } else { "safety" };
        if changed == 0 && sent == 0 && !rearm {
            tracing::debug!(pass, watched, exists = n.exists, lists = n.lists, data = n.data, bytes = n.bytes, changed, events = sent, took = ?t.elapsed(), "Checked ZooKeeper: nothing changed.");
        } else {
            tracing::info!(pass, watched, exists = n.exists, lists = n.lists, data = n.data, bytes = n.bytes, changed, events = sent, took = ?t.elapsed(), "Checked ZooKeeper.");
        }
        Ok(())
    }

    /// Lists every root and directory and sends the result (`Reset` when `reset`).
    async fn full_list(&mut self, tx: &EventSender, reset: bool) -> Result<(), RegistryError> {
        self.auth().await?;
        for (root, layout) in self.inner.roots.clone() {
            self.list_root(&root, layout).await?;
        }
        let all: Vec<Dir> = self.model.dirs.values().flatten().cloned().collect();
        let keep: BTreeSet<&Dir> = all.iter().collect();
        let gone: Vec<Dir> = self
            .model
            .states
            .keys()
            .filter(|d| !keep.contains(d))
            .cloned()
            .collect();
        let mut touched = Vec::new();
        for d in gone {
            self.model.apply(d, Read::Gone, &mut touched);
        }
        self.reader
            .read_dirs(&mut self.model, all, true, &mut touched)
            .await?;
        self.publish(tx, reset, touched, true).await.map(|_| ())
    }

    /// Applies fired watches: a root is listed again (new directories read whole, gone ones
    /// dropped), a directory reads what its fired watches point at; `undated` directories are
    /// read too (dated, and only what has no armed watch read). How many events it sent.
    async fn apply_fired(
        &mut self,
        tx: &EventSender,
        fired: Vec<String>,
        undated: Vec<Dir>,
    ) -> Result<usize, RegistryError> {
        let mut roots = BTreeSet::new();
        let mut dirs: BTreeSet<Dir> = undated.into_iter().collect();
        for key in fired {
            self.reader.disarm(&key);
            let path = key.get(2..).unwrap_or("");
            match target(&self.inner.roots, path) {
                Some(Target::Root(root, layout)) => {
                    roots.insert((root, layout));
                }
                Some(Target::Dir(dir)) => {
                    dirs.insert(dir);
                }
                None => {}
            }
        }
        let mut touched = Vec::new();
        for (root, layout) in &roots {
            // Taken out, not copied: list_root puts the new listing in its place.
            let before = self.model.dirs.remove(root).unwrap_or_default();
            self.list_root(root, *layout).await?;
            let after = self.model.dirs.get(root);
            let (gone, new): (Vec<Dir>, Vec<Dir>) = match after {
                Some(after) => (
                    before.difference(after).cloned().collect(),
                    after.difference(&before).cloned().collect(),
                ),
                None => (before.into_iter().collect(), Vec::new()),
            };
            for d in gone {
                dirs.remove(&d);
                self.model.apply(d, Read::Gone, &mut touched);
            }
            dirs.extend(new);
        }
        // Only directories still present under their root.
        let dirs: Vec<Dir> = dirs
            .into_iter()
            .filter(|d| self.model.dirs.get(&d.root).is_some_and(|s| s.contains(d)))
            .collect();
        self.reader
            .read_dirs(&mut self.model, dirs, false, &mut touched)
            .await?;
        self.publish(tx, false, touched, false).await
    }

    /// Sends the problems that changed and the services that changed (or a `Reset` of
    /// everything). `touched` are the directory scopes whose problems may have changed;
    /// `all` re-reports every scope (a full list). How many events it sent.
    async fn publish(
        &mut self,
        tx: &EventSender,
        reset: bool,
        touched: Vec<String>,
        all: bool,
    ) -> Result<usize, RegistryError> {
        let mut sent = 0;
        let (events, assembled) = self.model.sync(self.inner.discovery, reset);
        // Every scope that may have changed, with its full list: the directory's own problems
        // plus those from assembling (which may come and go for directories that did not
        // change); only the ones that differ from what was sent go out.
        let mut problems: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for scope in touched {
            problems.insert(scope, Vec::new());
        }
        if let Some(assembled) = assembled {
            let before = std::mem::replace(&mut self.assembly_problems, assembled);
            for scope in before
                .into_keys()
                .chain(self.assembly_problems.keys().cloned())
            {
                problems.insert(scope, Vec::new());
            }
        }
        for st in self.model.states.values() {
            if all {
                problems.insert(st.scope.clone(), st.converted.problems.clone());
            } else if !st.converted.problems.is_empty() {
                if let Some(p) = problems.get_mut(&st.scope) {
                    p.extend(st.converted.problems.iter().cloned());
                }
            }
        }
        for (scope, p) in &self.root_problems {
            problems
                .entry(scope.clone())
                .or_default()
                .extend(p.iter().cloned());
        }
        for (scope, p) in problems.iter_mut() {
            if let Some(extra) = self.assembly_problems.get(scope) {
                p.extend(extra.iter().cloned());
            }
        }
        for (scope, p) in problems {
            // A new watch re-sends everything: the core may hold scopes from an earlier one.
            let event = if reset {
                Some(self.sent_problems.record(&scope, p))
            } else {
                self.sent_problems.update(&scope, p)
            };
            if let Some(event) = event {
                if let RegistryEvent::Problems { problems, .. } = &event {
                    for line in problems {
                        tracing::warn!(problem = %line, "Skipped part of a ZooKeeper service.");
                    }
                }
                tx.send(event).await?;
                sent += 1;
            }
        }
        sent += events.len();
        for ev in events {
            tx.send(ev).await?;
        }
        Ok(sent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fired_paths_map_to_roots_and_directories() {
        let roots = vec![
            ("/dubbo".to_string(), Layout::Auto),
            ("/services".to_string(), Layout::Auto),
            ("/services/x".to_string(), Layout::Curator),
        ];
        let dir = |root: &str, name: &str, layout| {
            Some(Target::Dir(Dir {
                root: root.into(),
                name: name.into(),
                layout,
            }))
        };
        assert_eq!(
            target(&roots, "/dubbo"),
            Some(Target::Root("/dubbo".into(), Layout::Auto))
        );
        assert_eq!(
            target(&roots, "/dubbo/com.foo.Api/providers"),
            dir("/dubbo", "com.foo.Api", Layout::Auto)
        );
        assert_eq!(
            target(&roots, "/services/web/1"),
            dir("/services", "web", Layout::Auto)
        );
        assert_eq!(
            target(&roots, "/services/x/y"),
            dir("/services/x", "y", Layout::Curator)
        );
        assert_eq!(target(&roots, "/dubbox/a"), None);
        assert_eq!(target(&roots, "/other"), None);
        let slash = vec![("/".to_string(), Layout::Curator)];
        assert_eq!(target(&slash, "/web/1"), dir("/", "web", Layout::Curator));
        assert_eq!(
            target(&slash, "/"),
            Some(Target::Root("/".into(), Layout::Curator))
        );
    }
}
