//! Watches ZooKeeper.
//!
//! ZooKeeper watches are one-shot hints, and `zookeeper-async` loses them silently on every
//! reconnect (it never re-sends them) and opens a new session silently after expiry. So the
//! watcher applies each fired watch at once, and relies on re-listing to be correct:
//!
//! * one client is shared by every `watch()` call; a state listener records each transition;
//!   it is rebuilt (resolving the ensemble again) after a terminal state or when the ensemble
//!   resolves to other addresses (see [`crate::client`]);
//! * a watch starts by waiting for a connected session, adding digest auth, listing every root
//!   and service directory (arming child and data watches) and sending one `Reset`;
//! * a fired watch is applied at once with what re-arming it returns: the children of a Dubbo
//!   `providers` directory are its providers (one request, nothing else read), the children of
//!   a Curator directory its instances (data read for new ones only), an instance's data that
//!   instance; a root's children its service directories (new ones read whole). Only the
//!   services that changed are sent (`Upsert`/`Remove`). Watches that fired meanwhile are
//!   applied in the same pass; nothing waits for more (the core coalesces bursts,
//!   `--coalesce`);
//! * every transition back to `Connected` (a reconnect on the same session, or a new session
//!   after expiry) forgets all armed watches and re-lists everything, re-adding auth first (the
//!   client does not re-send auth either);
//! * a safety re-list runs every `--resync-interval`;
//! * a connection that stays down longer than [`DISCONNECT_GRACE`], or any request that fails
//!   with a connection error or times out, ends the watch with `Unavailable`: the core keeps
//!   serving the last good state (and stays ready: it has a state worth serving), reports the
//!   registry unhealthy, and calls `watch()` again, which waits for the session and starts over
//!   with a new `Reset`.
//!
//! This file is the watch: the session, the loop and what it sends. The registry's state is
//! held once, per service directory, in [`crate::model`] (which also works out what a change
//! sends); the requests that read ZooKeeper and arm its watches are [`crate::reads`].

use mcp_core::secret::{Secret, SecretSource};
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
use crate::model::{Dir, Model, Read};
use crate::reads::{Hint, Reader};

/// How long the connection may be down before the watch fails (the core then reports the
/// registry unhealthy on `/registryz`; it keeps serving and stays ready).
pub const DISCONNECT_GRACE: Duration = Duration::from_secs(1);
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
        let model = self
            .model
            .lock()
            .map(|mut m| std::mem::take(&mut *m))
            .unwrap_or_default();
        let mut s = Session {
            inner: &self,
            reader: Reader::new(
                Arc::clone(&client.zk),
                hint_tx,
                self.request_timeout,
                self.concurrency,
                &self.filters,
            ),
            model,
            root_problems: BTreeMap::new(),
            sent_problems: ProblemLedger::new(),
            assembly_problems: BTreeMap::new(),
        };
        let mut seen_gen = client.state.borrow_and_update().0;
        s.full_list(&tx, true).await?;
        tracing::info!(
            servers = %self.servers,
            services = s.model.served.len(),
            directories = s.model.states.len(),
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
                        s.reader.disarm_all();
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
                    // Whatever else has fired by now goes into the same pass; nothing waits for
                    // more (bursts are the core's to coalesce, `--coalesce`).
                    let mut fired = vec![first];
                    while let Ok(Hint(k)) = hints.try_recv() {
                        fired.push(k);
                    }
                    if down_since.is_none() {
                        let t = Instant::now();
                        let watches = fired.len();
                        s.apply_fired(&tx, fired).await?;
                        tracing::debug!(watches, took = ?t.elapsed(), "Applied fired watches.");
                    } else {
                        // Re-listed anyway once connected again.
                        for k in fired {
                            s.reader.disarm(&k);
                        }
                    }
                }
            }
        }
    }
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

    /// Re-lists every root and directory and sends the result (`Reset` when `reset`).
    async fn full_list(&mut self, tx: &EventSender, reset: bool) -> Result<(), RegistryError> {
        let digest = self.inner.digest.current().map_err(|e| {
            RegistryError::Unavailable(format!("cannot read --zk-digest-file: {e}"))
        })?;
        if let Some(d) = digest {
            check_digest(&d).map_err(|e| RegistryError::Unauthorized(e.to_string()))?;
            self.reader.add_auth(d.expose()).await?;
        }
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
        self.publish(tx, reset, touched, true).await
    }

    /// Applies fired watches: a root is listed again (new directories read whole, gone ones
    /// dropped), a directory reads what its fired watches point at.
    async fn apply_fired(
        &mut self,
        tx: &EventSender,
        fired: Vec<String>,
    ) -> Result<(), RegistryError> {
        let mut roots = BTreeSet::new();
        let mut dirs = BTreeSet::new();
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
    /// `all` re-reports every scope (a full list).
    async fn publish(
        &mut self,
        tx: &EventSender,
        reset: bool,
        touched: Vec<String>,
        all: bool,
    ) -> Result<(), RegistryError> {
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
            }
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
