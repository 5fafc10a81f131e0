//! Watches ZooKeeper.
//!
//! ZooKeeper watches are one-shot hints, and `zookeeper-async` loses them silently on every
//! reconnect (it never re-sends them) and opens a new session silently after expiry. So the
//! watcher treats every watch as a hint and relies on re-listing:
//!
//! * one client is shared by every `watch()` call; a state listener records each transition;
//!   it is rebuilt (resolving the ensemble again) after a terminal state or when the ensemble
//!   resolves to other addresses (see [`crate::client`]);
//! * a watch starts by waiting for a connected session, adding digest auth, listing every root
//!   and service directory (arming child and data watches) and sending one `Reset`;
//! * a fired watch marks its root or service directory dirty; after a short debounce the dirty
//!   parts are re-listed (re-arming what fired) and the changes sent as `Upsert`/`Remove`;
//! * every transition back to `Connected` (a reconnect on the same session, or a new session
//!   after expiry) forgets all armed watches and re-lists everything, re-adding auth first (the
//!   client does not re-send auth either);
//! * a safety re-list runs every `--resync-interval`;
//! * a connection that stays down longer than [`DISCONNECT_GRACE`], or any request that fails
//!   with a connection error or times out, ends the watch with `Unavailable`: the core keeps
//!   serving the last good state (and stays ready: it has a state worth serving), reports the
//!   registry unhealthy, and calls `watch()` again, which waits for the session and starts over
//!   with a new `Reset`.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, BoxStream, StreamExt};
use mcp_core::problems::ProblemLedger;
use mcp_core::{
    channel_stream, EventSender, Registry, RegistryError, RegistryEvent, Service, ServiceKey,
};
use tokio::sync::mpsc;
use tokio::time::{timeout, Instant};
use zookeeper_async::{WatchedEvent, ZkError, ZkState, ZooKeeper};

use crate::assemble::{assemble, Assembled};
use crate::client::{is_terminal, Client, Clients};
use crate::config::{DubboDiscovery, Layout, ZookeeperConfig};
use crate::convert::{convert_curator, convert_dubbo, Converted, Kind};
use crate::filter::Filters;

/// How long the connection may be down before the watch fails (the core then reports the
/// registry unhealthy on `/registryz`; it keeps serving and stays ready).
pub const DISCONNECT_GRACE: Duration = Duration::from_secs(1);
/// Longest a new watch waits for a connected session before failing.
const CONNECT_WAIT: Duration = Duration::from_secs(10);
/// Changes are collected this long after the first watch event before re-listing.
const DEBOUNCE: Duration = Duration::from_millis(10);

/// Dubbo categories: a directory holding one of them is a Dubbo interface.
const DUBBO_CATEGORIES: [&str; 4] = ["providers", "consumers", "routers", "configurators"];
/// Dubbo 3 bookkeeping under the Dubbo root, never services.
const DUBBO_RESERVED: [&str; 3] = ["config", "mapping", "metadata"];

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
    resync: Duration,
    concurrency: usize,
    digest: Option<String>,
    roots: Vec<(String, Layout)>,
    filters: Filters,
    discovery: DubboDiscovery,
    clients: Clients,
    /// What the last watch served and hid, handed to the next one: which of two colliding
    /// interfaces keeps the plain name, the ports of empty services and hidden Dubbo 3
    /// registrations must survive a reconnect, not only changes within one watch.
    carried: std::sync::Mutex<Carried>,
}

/// See [`Inner::carried`].
#[derive(Default)]
struct Carried {
    served: BTreeMap<ServiceKey, Service>,
    hidden: BTreeSet<ServiceKey>,
}

impl ZookeeperRegistry {
    /// Builds the registry; digest credentials come from `ZK_DIGEST` or `--zk-digest-file`.
    pub fn new(cfg: &ZookeeperConfig) -> Result<Self, ConfigError> {
        let digest = match &cfg.zk_digest_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|error| ConfigError::DigestFile {
                        path: path.display().to_string(),
                        error,
                    })?
                    .trim()
                    .to_string(),
            ),
            None => std::env::var("ZK_DIGEST").ok().filter(|d| !d.is_empty()),
        };
        Self::with_digest(cfg, digest)
    }

    /// Builds the registry with explicit digest credentials (tests).
    pub fn with_digest(cfg: &ZookeeperConfig, digest: Option<String>) -> Result<Self, ConfigError> {
        if digest
            .as_deref()
            .is_some_and(|d| d.split_once(':').is_none_or(|(u, _)| u.is_empty()))
        {
            return Err(ConfigError::Digest);
        }
        let roots = cfg.roots();
        if roots.is_empty() {
            return Err(ConfigError::NoRoot);
        }
        Ok(Self {
            inner: Arc::new(Inner {
                servers: cfg.zk_servers.clone(),
                request_timeout: cfg.zk_request_timeout.max(Duration::from_millis(100)),
                resync: cfg.resync_interval.max(Duration::from_secs(1)),
                concurrency: cfg.zk_concurrency.max(1),
                digest,
                roots,
                filters: Filters::new(cfg),
                discovery: cfg.dubbo_discovery,
                clients: Clients::new(cfg.zk_servers.clone(), cfg.zk_session_timeout),
                carried: std::sync::Mutex::new(Carried::default()),
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

/// A fired watch: which armed watch (`c:`/`d:`/`e:` + path) it was.
struct Hint(String);

/// Why a read failed.
enum OpError {
    /// The connection or session is gone: end the watch.
    Fatal(RegistryError),
    /// This znode cannot be read (reported as a problem).
    Skip(String),
}

fn fatal(e: RegistryError) -> OpError {
    OpError::Fatal(e)
}

/// One service directory: `{root}/{name}`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Dir {
    root: String,
    name: String,
    layout: Layout,
}

impl Dir {
    fn path(&self) -> String {
        join(&self.root, &self.name)
    }
}

/// What one directory produced.
#[derive(Debug, Default)]
struct DirState {
    scope: String,
    converted: Converted,
}

fn join(parent: &str, child: &str) -> String {
    if parent == "/" {
        format!("/{child}")
    } else {
        format!("{parent}/{child}")
    }
}

fn is_connected(s: ZkState) -> bool {
    matches!(s, ZkState::Connected | ZkState::ConnectedReadOnly)
}

/// What a fired watch on a path asks to re-list.
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

/// Per-watch state: what is armed, what each directory produced, what was sent.
struct Session<'a> {
    inner: &'a Inner,
    zk: Arc<ZooKeeper>,
    hints: mpsc::UnboundedSender<Hint>,
    armed: HashSet<String>,
    /// Service directories per root.
    dirs: BTreeMap<String, BTreeSet<Dir>>,
    states: BTreeMap<Dir, DirState>,
    /// Root-level problems already sent (scope -> non-empty).
    root_problems: BTreeMap<String, Vec<String>>,
    /// Problems last sent per scope (only changes are sent again).
    sent_problems: ProblemLedger,
    served: BTreeMap<ServiceKey, Service>,
    /// Services hidden because the other Dubbo registration serves their endpoints.
    hidden: BTreeSet<ServiceKey>,
}

impl Inner {
    /// Runs a ZooKeeper request with the request timeout and classifies its failure.
    async fn op<T>(
        &self,
        what: &str,
        fut: impl Future<Output = Result<T, ZkError>>,
    ) -> Result<Option<T>, OpError> {
        match timeout(self.request_timeout, fut).await {
            Err(_) => Err(fatal(RegistryError::Unavailable(format!(
                "ZooKeeper request for {what} timed out after {:?}",
                self.request_timeout
            )))),
            Ok(Ok(v)) => Ok(Some(v)),
            Ok(Err(ZkError::NoNode)) => Ok(None),
            Ok(Err(ZkError::NoAuth)) => Err(OpError::Skip(format!(
                "zookeeper {what}: not readable with the configured credentials (NoAuth)"
            ))),
            Ok(Err(ZkError::AuthFailed)) => Err(fatal(RegistryError::Unauthorized(format!(
                "ZooKeeper refused the digest credentials ({what})"
            )))),
            Ok(Err(
                e @ (ZkError::ConnectionLoss
                | ZkError::SessionExpired
                | ZkError::SessionMoved
                | ZkError::OperationTimeout
                | ZkError::MarshallingError),
            )) => Err(fatal(RegistryError::Unavailable(format!(
                "ZooKeeper request for {what} failed: {e:?}"
            )))),
            Ok(Err(e)) => Err(OpError::Skip(format!(
                "zookeeper {what}: cannot read ({e:?})"
            ))),
        }
    }

    /// Waits until the shared client has a connected session.
    async fn wait_connected(&self, client: &mut Client) -> Result<(), RegistryError> {
        let deadline = Instant::now() + CONNECT_WAIT;
        loop {
            let (seen, state) = *client.state.borrow_and_update();
            if is_connected(state) {
                return Ok(());
            }
            if seen == 0 {
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
            if is_terminal(client.state.borrow().1) {
                self.clients
                    .discard("no session and the state is terminal")
                    .await;
            }
            return Err(e);
        }
        let (hint_tx, mut hints) = mpsc::unbounded_channel();
        let carried = self
            .carried
            .lock()
            .map(|mut c| std::mem::take(&mut *c))
            .unwrap_or_default();
        let mut s = Session {
            inner: &self,
            zk: Arc::clone(&client.zk),
            hints: hint_tx,
            armed: HashSet::new(),
            dirs: BTreeMap::new(),
            states: BTreeMap::new(),
            root_problems: BTreeMap::new(),
            sent_problems: ProblemLedger::new(),
            served: carried.served,
            hidden: carried.hidden,
        };
        let mut seen_gen = client.state.borrow_and_update().0;
        s.full_list(&tx, true).await?;
        tracing::info!(
            servers = %self.servers,
            services = s.served.len(),
            directories = s.states.len(),
            "Listed ZooKeeper."
        );

        let mut resync = tokio::time::interval_at(Instant::now() + self.resync, self.resync);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut down_since: Option<Instant> = None;
        loop {
            let grace = async {
                match down_since {
                    Some(t) => tokio::time::sleep_until(t + DISCONNECT_GRACE).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = client.state.changed() => {
                    if changed.is_err() {
                        self.clients.discard("its IO task stopped").await;
                        return Err(RegistryError::Unavailable("ZooKeeper client stopped".into()));
                    }
                    let (gen, state) = *client.state.borrow_and_update();
                    if gen == seen_gen {
                        continue;
                    }
                    seen_gen = gen;
                    if is_connected(state) {
                        // Back on the same session or on a new one: watches (and auth) are
                        // gone either way.
                        down_since = None;
                        tracing::info!("ZooKeeper connected again; re-listing everything.");
                        s.armed.clear();
                        s.full_list(&tx, false).await?;
                    } else if state == ZkState::AuthFailed {
                        self.clients.discard("ZooKeeper refused the digest credentials").await;
                        return Err(RegistryError::Unauthorized(
                            "ZooKeeper refused the digest credentials".into(),
                        ));
                    } else if is_terminal(state) {
                        self.clients.discard("the session was closed").await;
                        return Err(RegistryError::Unavailable(format!(
                            "the ZooKeeper session with {} was closed",
                            self.servers
                        )));
                    } else if down_since.is_none() {
                        down_since = Some(Instant::now());
                    }
                }
                () = grace => {
                    return Err(RegistryError::Unavailable(format!(
                        "lost the ZooKeeper connection to {} for more than {DISCONNECT_GRACE:?}",
                        self.servers
                    )));
                }
                _ = resync.tick() => {
                    if down_since.is_none() {
                        tracing::debug!("Periodic ZooKeeper re-list.");
                        s.full_list(&tx, false).await?;
                    }
                }
                hint = hints.recv() => {
                    let Some(Hint(first)) = hint else {
                        return Err(RegistryError::Ended);
                    };
                    let mut fired = vec![first];
                    tokio::time::sleep(DEBOUNCE).await;
                    while let Ok(Hint(k)) = hints.try_recv() {
                        fired.push(k);
                    }
                    if down_since.is_none() {
                        let t = Instant::now();
                        s.relist_fired(&tx, fired).await?;
                        tracing::debug!(took = ?t.elapsed(), "Re-listed what changed.");
                    } else {
                        // Re-listed anyway once connected again.
                        for k in fired {
                            s.armed.remove(&k);
                        }
                    }
                }
            }
        }
    }
}

impl Drop for Session<'_> {
    /// Hands what was served to the next watch (see [`Inner::carried`]).
    fn drop(&mut self) {
        if let Ok(mut c) = self.inner.carried.lock() {
            c.served = std::mem::take(&mut self.served);
            c.hidden = std::mem::take(&mut self.hidden);
        }
    }
}

impl Session<'_> {
    /// A watch closure that reports `key` when it fires.
    fn watcher(&self, key: String) -> impl FnOnce(WatchedEvent) + Send + 'static {
        let tx = self.hints.clone();
        move |ev: WatchedEvent| {
            tracing::debug!(watch = %key, event = ?ev.event_type, "ZooKeeper watch fired.");
            let _ = tx.send(Hint(key));
        }
    }

    /// Children of `path`, arming a child watch unless one is armed; `None` if it is missing.
    /// Newly armed watch keys are pushed to `armed`.
    async fn children(
        &self,
        path: &str,
        armed: &mut Vec<String>,
    ) -> Result<Option<Vec<String>>, OpError> {
        let key = format!("c:{path}");
        let zk = &self.zk;
        let r = if self.armed.contains(&key) {
            self.inner.op(path, zk.get_children(path, false)).await?
        } else {
            let r = self
                .inner
                .op(path, zk.get_children_w(path, self.watcher(key.clone())))
                .await?;
            if r.is_some() {
                armed.push(key);
            }
            r
        };
        Ok(r)
    }

    /// Lists a root's service directories; a missing root gets a creation watch.
    async fn list_root(&mut self, root: &str, layout: Layout) -> Result<(), RegistryError> {
        let zk = Arc::clone(&self.zk);
        let ekey = format!("e:{root}");
        let exists = if self.armed.contains(&ekey) {
            self.inner.op(root, zk.exists(root, false)).await
        } else {
            let w = self.watcher(ekey.clone());
            let r = self.inner.op(root, zk.exists_w(root, w)).await;
            if r.is_ok() {
                self.armed.insert(ekey);
            }
            r
        };
        let names = match exists {
            Ok(Some(Some(_))) => {
                let mut newly = Vec::new();
                let r = self.children(root, &mut newly).await;
                self.armed.extend(newly);
                r.map(Option::unwrap_or_default)
            }
            Ok(_) => Ok(Vec::new()),
            Err(e) => Err(e),
        };
        let scope = format!("zookeeper {root}");
        let (names, problems) = match names {
            Ok(n) => (n, Vec::new()),
            Err(OpError::Fatal(e)) => return Err(e),
            Err(OpError::Skip(p)) => (Vec::new(), vec![p]),
        };
        self.root_problems.insert(scope, problems);
        let dirs = names
            .into_iter()
            .filter(|n| !(root == "/" && n == "zookeeper"))
            .filter(|n| self.inner.filters.services.allows(n))
            .map(|name| Dir {
                root: root.to_string(),
                name,
                layout,
            })
            .collect();
        self.dirs.insert(root.to_string(), dirs);
        Ok(())
    }

    /// Reads one service directory; returns what it produced and the watches it armed.
    async fn list_dir(&self, dir: &Dir) -> Result<(DirState, Vec<String>), RegistryError> {
        let path = dir.path();
        let mut newly = Vec::new();
        let mut state = DirState {
            scope: format!("zookeeper {path}"),
            converted: Converted::default(),
        };
        let children = match self.children(&path, &mut newly).await {
            Ok(c) => c.unwrap_or_default(),
            Err(OpError::Fatal(e)) => return Err(e),
            Err(OpError::Skip(p)) => {
                state.converted.problems.push(p);
                return Ok((state, newly));
            }
        };
        let dubbo = match dir.layout {
            Layout::Dubbo => true,
            Layout::Curator | Layout::Dubbo3 => false,
            Layout::Auto => children
                .iter()
                .any(|c| DUBBO_CATEGORIES.contains(&c.as_str())),
        };
        if dubbo {
            let providers_path = join(&path, "providers");
            state.scope = format!("zookeeper {providers_path}");
            if !children.iter().any(|c| c == "providers") {
                return Ok((state, newly));
            }
            match self.children(&providers_path, &mut newly).await {
                Ok(p) => {
                    state.converted = convert_dubbo(
                        &dir.root,
                        &dir.name,
                        &p.unwrap_or_default(),
                        &self.inner.filters,
                    );
                }
                Err(OpError::Fatal(e)) => return Err(e),
                Err(OpError::Skip(p)) => state.converted.problems.push(p),
            }
            return Ok((state, newly));
        }
        // Dubbo 3 bookkeeping under a Dubbo root (a Spring service may well be called `config`
        // under the Curator default root).
        if dir.layout == Layout::Auto
            && dir.root != "/services"
            && DUBBO_RESERVED.contains(&dir.name.as_str())
        {
            return Ok((state, newly));
        }
        // Curator: one data read per instance, armed unless armed already.
        let inner = self.inner;
        let results: Vec<_> = stream::iter(children)
            .map(|id| {
                let p = join(&path, &id);
                let key = format!("d:{p}");
                let w = (!self.armed.contains(&key)).then(|| self.watcher(key.clone()));
                let zk = &self.zk;
                async move {
                    let r = match w {
                        Some(w) => inner.op(&p, zk.get_data_w(&p, w)).await,
                        None => inner.op(&p, zk.get_data(&p, false)).await,
                    };
                    (id, key, r)
                }
            })
            .buffered(inner.concurrency)
            .collect()
            .await;
        let mut instances = Vec::with_capacity(results.len());
        let mut problems = Vec::new();
        for (id, key, r) in results {
            match r {
                Ok(Some((data, _stat))) => {
                    if !self.armed.contains(&key) {
                        newly.push(key);
                    }
                    instances.push((id, data));
                }
                Ok(None) => {}
                Err(OpError::Fatal(e)) => return Err(e),
                Err(OpError::Skip(p)) => problems.push(p),
            }
        }
        state.converted = convert_curator(&dir.root, &dir.name, &instances);
        state.converted.problems.extend(problems);
        Ok((state, newly))
    }

    /// Lists directories concurrently.
    async fn list_dirs(&mut self, dirs: Vec<Dir>) -> Result<(), RegistryError> {
        let results: Vec<_> = {
            let this = &*self;
            stream::iter(dirs)
                .map(|d| async move {
                    let r = this.list_dir(&d).await;
                    (d, r)
                })
                .buffer_unordered(this.inner.concurrency)
                .collect()
                .await
        };
        for (dir, r) in results {
            let (mut state, newly) = r?;
            self.armed.extend(newly);
            // A Dubbo 3 application with no instance left looks like an empty Curator service;
            // it is still the same application (for --dubbo-discovery).
            if state.converted.kind == Kind::Curator
                && state
                    .converted
                    .service
                    .as_ref()
                    .is_some_and(|s| s.endpoints.is_empty())
                && self
                    .states
                    .get(&dir)
                    .is_some_and(|old| old.converted.kind == Kind::Dubbo3Application)
            {
                state.converted.kind = Kind::Dubbo3Application;
            }
            self.states.insert(dir, state);
        }
        Ok(())
    }

    /// Re-lists every root and directory and sends the result (`Reset` when `reset`).
    async fn full_list(&mut self, tx: &EventSender, reset: bool) -> Result<(), RegistryError> {
        if let Some(d) = &self.inner.digest {
            let zk = Arc::clone(&self.zk);
            match self
                .inner
                .op("auth", zk.add_auth("digest", d.as_bytes().to_vec()))
                .await
            {
                Ok(_) => {}
                Err(OpError::Fatal(e)) => return Err(e),
                Err(OpError::Skip(p)) => {
                    return Err(RegistryError::Unauthorized(p));
                }
            }
        }
        for (root, layout) in self.inner.roots.clone() {
            self.list_root(&root, layout).await?;
        }
        let all: Vec<Dir> = self.dirs.values().flatten().cloned().collect();
        let keep: BTreeSet<&Dir> = all.iter().collect();
        let gone: Vec<Dir> = self
            .states
            .keys()
            .filter(|d| !keep.contains(d))
            .cloned()
            .collect();
        let mut cleared = Vec::new();
        for d in gone {
            if let Some(st) = self.states.remove(&d) {
                cleared.push(st.scope);
            }
        }
        self.list_dirs(all).await?;
        self.publish(tx, reset, cleared).await
    }

    /// Re-lists what fired watches point at.
    async fn relist_fired(
        &mut self,
        tx: &EventSender,
        fired: Vec<String>,
    ) -> Result<(), RegistryError> {
        let mut roots = BTreeSet::new();
        let mut dirs = BTreeSet::new();
        for key in fired {
            self.armed.remove(&key);
            let path = key.get(2..).unwrap_or("").to_string();
            match target(&self.inner.roots, &path) {
                Some(Target::Root(root, layout)) => {
                    roots.insert((root, layout));
                }
                Some(Target::Dir(dir)) => {
                    dirs.insert(dir);
                }
                None => {}
            }
        }
        let mut cleared = Vec::new();
        for (root, layout) in &roots {
            let before = self.dirs.get(root).cloned().unwrap_or_default();
            self.list_root(root, *layout).await?;
            let after = self.dirs.get(root).cloned().unwrap_or_default();
            for d in before.difference(&after) {
                if let Some(st) = self.states.remove(d) {
                    cleared.push(st.scope);
                }
                dirs.remove(d);
            }
            for d in after.difference(&before) {
                dirs.insert(d.clone());
            }
        }
        // Only directories still present under their root.
        let dirs: Vec<Dir> = dirs
            .into_iter()
            .filter(|d| self.dirs.get(&d.root).is_some_and(|s| s.contains(d)))
            .collect();
        let t = Instant::now();
        self.list_dirs(dirs).await?;
        tracing::debug!(took = ?t.elapsed(), "Listed directories.");
        self.publish(tx, false, cleared).await
    }

    /// Sends problems and the services that changed (or a `Reset` of everything).
    async fn publish(
        &mut self,
        tx: &EventSender,
        reset: bool,
        cleared: Vec<String>,
    ) -> Result<(), RegistryError> {
        let assembled = assemble(
            self.states
                .values()
                .map(|st| (st.scope.as_str(), &st.converted)),
            self.inner.discovery,
            &self.served,
            &self.hidden,
        );
        let Assembled {
            services: next,
            problems: mut extra,
            hidden,
        } = assembled;
        let mut events = Vec::new();
        if reset {
            let all: BTreeMap<ServiceKey, Service> =
                next.into_iter().map(|(k, s)| (k, s.into_owned())).collect();
            self.served = all;
        } else {
            for k in self.served.keys() {
                if !next.contains_key(k) {
                    events.push(RegistryEvent::Remove(k.clone()));
                }
            }
            for (k, s) in next {
                if self.served.get(&k) != Some(s.as_ref()) {
                    events.push(RegistryEvent::Upsert(s.into_owned()));
                }
            }
            for ev in &events {
                match ev {
                    RegistryEvent::Remove(k) => {
                        self.served.remove(k);
                    }
                    RegistryEvent::Upsert(s) => {
                        self.served.insert(s.key.clone(), s.clone());
                    }
                    _ => {}
                }
            }
        }
        self.hidden = hidden;
        // Every scope's full list; only the ones that differ from what was sent go out.
        let mut problems: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for scope in cleared {
            problems.insert(scope, Vec::new());
        }
        for (scope, p) in &self.root_problems {
            problems.insert(scope.clone(), p.clone());
        }
        for st in self.states.values() {
            let mut p = st.converted.problems.clone();
            p.extend(extra.remove(&st.scope).unwrap_or_default());
            problems.insert(st.scope.clone(), p);
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
            }
        }
        if reset {
            return tx
                .send(RegistryEvent::Reset(
                    self.served.values().cloned().collect(),
                ))
                .await;
        }
        for ev in events {
            tx.send(ev).await?;
        }
        Ok(())
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
