//! The ZooKeeper requests of one watch: listing a root, reading a service directory (a Dubbo
//! interface's providers, a Curator directory's instances), adding the digest credentials.
//!
//! ZooKeeper watches fire once, so every read arms a watch on what it read unless one is armed
//! already: what an armed watch covers ([`Reader::armed`]) is known to be as read, and a read
//! that is not a full list reads only what none covers (a watch that fired, a new child). Every
//! request runs with the request timeout; directories, and the instances of one, are read
//! `--zk-concurrency` at a time. A failed request either ends the watch (the connection or
//! session is gone, the request timed out, the credentials were refused) or is a problem of the
//! one znode it read.
//!
//! Apart from the session loop ([`crate::registry`]) and from what the reads find ([`Read`],
//! applied by [`crate::model`]): the only state here is which watches are armed.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, StreamExt};
use mcp_core::RegistryError;
use tokio::sync::mpsc;
use tokio::time::timeout;
use zookeeper_async::{WatchedEvent, ZkError, ZooKeeper};

use crate::config::Layout;
use crate::convert::convert_dubbo;
use crate::filter::Filters;
use crate::model::{join, shape, Dir, DirState, Fetched, Held, Model, Read, Shape};

/// A fired watch: which armed watch (`c:`/`d:`/`e:` + path) it was.
pub(crate) struct Hint(pub(crate) String);

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

/// Key of the child watch on `path` in [`Reader::armed`].
fn child_key(path: &str) -> String {
    format!("c:{path}")
}

/// Key of the data watch on `path` in [`Reader::armed`].
pub(crate) fn data_key(path: &str) -> String {
    format!("d:{path}")
}

/// How one watch reads ZooKeeper: its session, the read settings, and the watches its reads
/// armed.
pub(crate) struct Reader<'a> {
    zk: Arc<ZooKeeper>,
    /// Where an armed watch reports when it fires.
    hints: mpsc::UnboundedSender<Hint>,
    request_timeout: Duration,
    concurrency: usize,
    filters: &'a Filters,
    /// Watches armed and not fired yet: what they watch is known to be as read.
    armed: HashSet<String>,
}

impl<'a> Reader<'a> {
    /// A reader on session `zk` with nothing armed; fired watches are sent to `hints`.
    pub(crate) fn new(
        zk: Arc<ZooKeeper>,
        hints: mpsc::UnboundedSender<Hint>,
        request_timeout: Duration,
        concurrency: usize,
        filters: &'a Filters,
    ) -> Self {
        Self {
            zk,
            hints,
            request_timeout,
            concurrency,
            filters,
            armed: HashSet::new(),
        }
    }

    /// Forgets a watch that fired: what it watched is read again.
    pub(crate) fn disarm(&mut self, key: &str) {
        self.armed.remove(key);
    }

    /// Forgets every armed watch (the client drops them all on a reconnect).
    pub(crate) fn disarm_all(&mut self) {
        self.armed.clear();
    }

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

    /// Adds the digest credentials to the session (the client does not re-send them after a
    /// reconnect either).
    pub(crate) async fn add_auth(&self, digest: &str) -> Result<(), RegistryError> {
        let zk = Arc::clone(&self.zk);
        match self
            .op("auth", zk.add_auth("digest", digest.as_bytes().to_vec()))
            .await
        {
            Ok(_) => Ok(()),
            Err(OpError::Fatal(e)) => Err(e),
            Err(OpError::Skip(p)) => Err(RegistryError::Unauthorized(p)),
        }
    }

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
        let key = child_key(path);
        let zk = &self.zk;
        let r = if self.armed.contains(&key) {
            self.op(path, zk.get_children(path, false)).await?
        } else {
            let r = self
                .op(path, zk.get_children_w(path, self.watcher(key.clone())))
                .await?;
            if r.is_some() {
                armed.push(key);
            }
            r
        };
        Ok(r)
    }

    /// Lists a root's service directories (those the service filter allows) and the root's
    /// problems; a missing root gets a creation watch.
    pub(crate) async fn list_root(
        &mut self,
        root: &str,
        layout: Layout,
    ) -> Result<(BTreeSet<Dir>, Vec<String>), RegistryError> {
        let zk = Arc::clone(&self.zk);
        let ekey = format!("e:{root}");
        let exists = if self.armed.contains(&ekey) {
            self.op(root, zk.exists(root, false)).await
        } else {
            let w = self.watcher(ekey.clone());
            let r = self.op(root, zk.exists_w(root, w)).await;
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
        let (names, problems) = match names {
            Ok(n) => (n, Vec::new()),
            Err(OpError::Fatal(e)) => return Err(e),
            Err(OpError::Skip(p)) => (Vec::new(), vec![p]),
        };
        let dirs = names
            .into_iter()
            .filter(|n| !(root == "/" && n == "zookeeper"))
            .filter(|n| self.filters.services.allows(n))
            .map(|name| Dir {
                root: root.to_string(),
                name,
                layout,
            })
            .collect();
        Ok((dirs, problems))
    }

    /// Reads what may have changed in one directory, re-arming as it reads: everything when
    /// `full`, else only what has no armed watch (a watch that fired is disarmed, a new child
    /// has none); what is still watched is as `old` holds it. Returns the watches it armed.
    async fn read_dir(
        &self,
        dir: &Dir,
        old: Option<&DirState>,
        full: bool,
    ) -> Result<(Read, Vec<String>, Option<i64>), RegistryError> {
        let path = dir.path();
        let mut newly = Vec::new();
        let known = old.filter(|_| !full && self.armed.contains(&child_key(&path)));
        // When ZooKeeper created the directory (`czxid`): read once, and again on a full read
        // (it may have been deleted and created again unseen). Unreadable: undated for now.
        let czxid = if full || old.is_none_or(|o| !o.dated()) {
            match self.op(&path, self.zk.exists(&path, false)).await {
                Ok(Some(Some(stat))) => Some(stat.czxid),
                Ok(_) | Err(OpError::Skip(_)) => None,
                Err(OpError::Fatal(e)) => return Err(e),
            }
        } else {
            None
        };
        let shape = match known.map(|o| &o.held) {
            Some(Held::Nothing) => return Ok((Read::Unchanged, newly, czxid)),
            Some(Held::Providers) => Shape::Dubbo { providers: true },
            Some(Held::Instances(m)) => Shape::Curator(m.keys().cloned().collect()),
            None => match self.children(&path, &mut newly).await {
                Ok(Some(children)) => shape(dir, children),
                Ok(None) => return Ok((Read::Gone, newly, None)),
                Err(OpError::Fatal(e)) => return Err(e),
                Err(OpError::Skip(p)) => {
                    let read = Read::from(DirState::unreadable(dir.scope(false), p));
                    return Ok((read, newly, czxid));
                }
            },
        };
        let read = match shape {
            Shape::Reserved => Read::from(DirState::nothing(dir.scope(false))),
            Shape::Dubbo { providers: false } => Read::from(DirState::nothing(dir.scope(true))),
            Shape::Dubbo { providers: true } => {
                self.read_providers(dir, old, full, &mut newly).await?
            }
            Shape::Curator(ids) => self.read_instances(dir, old, full, ids, &mut newly).await?,
        };
        Ok((read, newly, czxid))
    }

    /// A Dubbo interface's providers: the children of its `providers` directory, converted
    /// whole (the znode names are the data), unless that directory's watch is still armed.
    async fn read_providers(
        &self,
        dir: &Dir,
        old: Option<&DirState>,
        full: bool,
        newly: &mut Vec<String>,
    ) -> Result<Read, RegistryError> {
        let path = join(&dir.path(), "providers");
        let scope = dir.scope(true);
        if !full
            && old.is_some_and(|o| o.held == Held::Providers)
            && self.armed.contains(&child_key(&path))
        {
            return Ok(Read::Unchanged);
        }
        Ok(match self.children(&path, newly).await {
            Ok(Some(providers)) => {
                let converted = convert_dubbo(&dir.root, &dir.name, &providers, self.filters);
                Read::from(DirState::new(scope, Held::Providers, converted))
            }
            // Deleted since its parent was listed: no `providers` directory, nothing served.
            Ok(None) => Read::from(DirState::nothing(scope)),
            Err(OpError::Fatal(e)) => return Err(e),
            Err(OpError::Skip(p)) => Read::from(DirState::unreadable(scope, p)),
        })
    }

    /// A Curator directory's instances `ids`: the data of those that are new or whose data
    /// watch fired (of all of them when `full`), arming data watches; the others keep theirs.
    async fn read_instances(
        &self,
        dir: &Dir,
        old: Option<&DirState>,
        full: bool,
        ids: Vec<String>,
        newly: &mut Vec<String>,
    ) -> Result<Read, RegistryError> {
        let path = dir.path();
        let held = old.and_then(|o| match &o.held {
            Held::Instances(m) => Some(m),
            _ => None,
        });
        let to_read = instances_to_read(&path, &ids, held, full, &self.armed);
        // Nothing to read and no instance gone (every id is held, and as many as held).
        if to_read.is_empty() && held.is_some_and(|m| m.len() == ids.len()) {
            return Ok(Read::Unchanged);
        }
        let results: Vec<_> = stream::iter(to_read)
            .map(|id| {
                let p = join(&path, &id);
                let key = data_key(&p);
                let w = (!self.armed.contains(&key)).then(|| self.watcher(key.clone()));
                let zk = &self.zk;
                async move {
                    let r = match w {
                        Some(w) => self.op(&p, zk.get_data_w(&p, w)).await,
                        None => self.op(&p, zk.get_data(&p, false)).await,
                    };
                    (id, key, r)
                }
            })
            .buffered(self.concurrency)
            .collect()
            .await;
        let mut read = Vec::with_capacity(results.len());
        for (id, key, r) in results {
            let fetched = match r {
                Ok(Some((data, _stat))) => {
                    if !self.armed.contains(&key) {
                        newly.push(key);
                    }
                    Fetched::Data(data)
                }
                Ok(None) => Fetched::Missing,
                Err(OpError::Fatal(e)) => return Err(e),
                Err(OpError::Skip(p)) => Fetched::Problem(p),
            };
            read.push((id, fetched));
        }
        Ok(Read::Instances { ids, read })
    }

    /// Reads directories concurrently and applies what they hold to `model`.
    pub(crate) async fn read_dirs(
        &mut self,
        model: &mut Model,
        dirs: Vec<Dir>,
        full: bool,
        touched: &mut Vec<String>,
    ) -> Result<(), RegistryError> {
        let results: Vec<_> = {
            let this = &*self;
            let states = &model.states;
            stream::iter(dirs)
                .map(|d| async move {
                    let r = this.read_dir(&d, states.get(&d), full).await;
                    (d, r)
                })
                .buffer_unordered(this.concurrency)
                .collect()
                .await
        };
        for (dir, r) in results {
            let (read, newly, czxid) = r?;
            self.armed.extend(newly);
            model.apply_dated(dir, read, czxid, touched);
        }
        Ok(())
    }
}

/// The instances of the directory at `path` to read: every one when `full`, else those not
/// held yet and those whose data watch is not armed (it fired, or could not be armed).
pub(crate) fn instances_to_read(
    path: &str,
    ids: &[String],
    held: Option<&BTreeMap<String, Result<Vec<u8>, String>>>,
    full: bool,
    armed: &HashSet<String>,
) -> Vec<String> {
    ids.iter()
        .filter(|id| {
            full || !held.is_some_and(|m| m.contains_key(*id))
                || !armed.contains(&data_key(&join(path, id)))
        })
        .cloned()
        .collect()
}
