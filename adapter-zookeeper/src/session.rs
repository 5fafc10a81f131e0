//! One watch's session with ZooKeeper: the registry as that watch knows it, and the passes it
//! runs over it. A full list (at the start of a watch), a check (the safety pass, or the re-arm
//! after a reconnect on the same session) and the application of fired watches each read what
//! they must through [`crate::reads`], apply it to [`crate::model`], and send only what changed:
//! the services, and the problems of each scope that differ from what was last sent.
//!
//! The loop that decides which pass runs, and when the registry is reported unreachable, is
//! [`crate::registry`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use mcp_core::problems::ProblemLedger;
use mcp_core::{EventSender, RegistryError, RegistryEvent};
use tokio::time::Instant;
use zookeeper_async::ZooKeeper;

use crate::config::Layout;
use crate::model::{join, Dir, Held, Model, Read};
use crate::reads::Reader;
use crate::registry::{check_digest, Inner};
use crate::watches::{child_key, data_key, Stamping};

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
pub(crate) struct Session<'a> {
    inner: &'a Inner,
    /// Reads ZooKeeper for this watch; holds the watches it armed.
    pub(crate) reader: Reader<'a>,
    /// Taken from [`Inner::model`] for this watch, handed back when it ends.
    pub(crate) model: Model,
    /// Root-level problems (scope -> problems).
    root_problems: BTreeMap<String, Vec<String>>,
    /// Problems last sent per scope (only changes are sent again).
    sent_problems: ProblemLedger,
    /// Problems from the last assembly (renamed interfaces, duplicate names), per scope.
    assembly_problems: BTreeMap<String, Vec<String>>,
}

impl<'a> Session<'a> {
    /// A watch's session on `zk`, starting from the registry as the last watch knew it.
    pub(crate) fn new(inner: &'a Inner, zk: Arc<ZooKeeper>, model: Model) -> Self {
        Self {
            inner,
            reader: Reader::new(zk, inner.request_timeout, inner.concurrency, &inner.filters),
            model,
            root_problems: BTreeMap::new(),
            sent_problems: ProblemLedger::new(),
            assembly_problems: BTreeMap::new(),
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
    pub(crate) async fn check(
        &mut self,
        tx: &EventSender,
        rearm: bool,
    ) -> Result<(), RegistryError> {
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
    pub(crate) async fn full_list(
        &mut self,
        tx: &EventSender,
        reset: bool,
    ) -> Result<(), RegistryError> {
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
    pub(crate) async fn apply_fired(
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
