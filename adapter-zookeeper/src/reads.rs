//! The ZooKeeper requests of one watch: listing a root, reading a service directory (a Dubbo
//! interface's providers, a Curator directory's instances), adding the digest credentials.
//!
//! ZooKeeper watches fire once, so every read arms a watch on what it read unless one is armed
//! already: what an armed watch covers ([`Reader::armed`]) is known to be as read, and a read
//! that is not a full list reads only what none covers (a watch that fired, a new child). Every
//! request runs with the request timeout; directories, and the instances of one, are read
//! `--zk-concurrency` at a time. What a failed request means (the watch ends, the pass ends, or
//! one znode is a problem) is [`crate::requests`]; a pass cut short by a lost connection
//! ([`Reader::take_interrupted`]) is done again by the session once connected.
//!
//! Every znode read is stamped with its `Stat` (the zxids and versions that change with its
//! data, its children or its ACL), so that [`Reader::check`] (the safety pass, and the re-arm
//! after a reconnect) asks for one `exists` per watched znode and reads again only what
//! changed. A directory's stamp is taken by an `exists` just before it is listed, in a full list
//! and in a check; a directory listed because its watch fired loses its stamp (the next check
//! lists it once more, stamped). An instance's stamp comes with its data, at no cost.
//!
//! Apart from the session loop ([`crate::registry`]) and from what the reads find ([`Read`],
//! applied by [`crate::model`]): the state here is which watches are armed and the stamps; the
//! watch keys and the stamp itself are [`crate::watches`].

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::{self, StreamExt};
use mcp_core::RegistryError;
use zookeeper_async::ZooKeeper;

use crate::config::Layout;
use crate::convert::convert_dubbo;
use crate::filter::Filters;
use crate::model::{join, shape, Dir, DirState, Fetched, Held, Model, Read, Shape};
use crate::requests::{Counts, OpError, Req, Requests};
use crate::watches::{child_key, data_key, exists_key, Stamp, Stamping};

/// How one watch reads ZooKeeper: its session, the read settings, and the watches its reads
/// armed.
pub(crate) struct Reader<'a> {
    /// The session's requests: timeout, what a failure means, counts.
    req: Requests,
    concurrency: usize,
    filters: &'a Filters,
    /// Watches armed and not fired yet: what they watch is known to be as read.
    armed: HashSet<String>,
    /// The stamp of each znode as last read (`None`: it did not exist), by path.
    stamps: Mutex<HashMap<String, Option<Stamp>>>,
    /// What listing a directory does with its stamp.
    pub(crate) stamping: Stamping,
    /// The directories (and `providers` directories) the running check stamped, each with
    /// whether it may have been created again since it was read (its `czxid` changed, or it
    /// was not stamped before): their directory is dated again. Emptied by the next check.
    checked: HashMap<String, bool>,
}

impl<'a> Reader<'a> {
    /// A reader on session `zk` with nothing armed (fired watches reach the session through
    /// the client's route, [`crate::client::Client::route_to`]).
    pub(crate) fn new(
        zk: Arc<ZooKeeper>,
        request_timeout: Duration,
        concurrency: usize,
        filters: &'a Filters,
    ) -> Self {
        Self {
            req: Requests::new(zk, request_timeout),
            concurrency,
            filters,
            armed: HashSet::new(),
            stamps: Mutex::new(HashMap::new()),
            stamping: Stamping::Forget,
            checked: HashMap::new(),
        }
    }

    /// Requests sent so far.
    pub(crate) fn counts(&self) -> Counts {
        self.req.counts()
    }

    /// Whether a request failed because the connection was lost since the last call: the
    /// failure then ends the pass, not the watch.
    pub(crate) fn take_interrupted(&self) -> bool {
        self.req.take_interrupted()
    }

    /// Adds the digest credentials to the session (the client does not re-send them after a
    /// reconnect either).
    pub(crate) async fn add_auth(&self, digest: &str) -> Result<(), RegistryError> {
        self.req.add_auth(digest).await
    }

    fn record(&self, path: &str, stamp: Option<Stamp>) {
        if let Ok(mut m) = self.stamps.lock() {
            m.insert(path.to_string(), stamp);
        }
    }

    fn forget(&self, path: &str) {
        if let Ok(mut m) = self.stamps.lock() {
            m.remove(path);
        }
    }

    fn stamp(&self, path: &str) -> Option<Option<Stamp>> {
        self.stamps.lock().ok().and_then(|m| m.get(path).copied())
    }

    /// Ends a check: what it stamped no longer dates directories again.
    pub(crate) fn end_check(&mut self) {
        self.checked.clear();
    }

    /// Forgets a watch that fired: what it watched is read again.
    pub(crate) fn disarm(&mut self, key: &str) {
        self.armed.remove(key);
    }

    /// Forgets every armed watch (the client drops them all on a reconnect).
    pub(crate) fn disarm_all(&mut self) {
        self.armed.clear();
    }

    /// Children of `path`, arming a child watch unless one is armed; `None` if it is missing.
    /// Newly armed watch keys are pushed to `armed`. `stamping` says what happens to its stamp.
    async fn children(
        &self,
        path: &str,
        armed: &mut Vec<String>,
        stamping: Stamping,
    ) -> Result<Option<Vec<String>>, OpError> {
        let key = child_key(path);
        let zk = &self.req.zk;
        match stamping {
            Stamping::Before => {
                let st = self
                    .req
                    .op(Req::Exists, path, zk.exists(path, false))
                    .await?;
                self.record(path, st.as_ref().and_then(Option::as_ref).map(Stamp::of));
            }
            Stamping::Keep => {}
            Stamping::Forget => self.forget(path),
        }
        let r = if self.armed.contains(&key) {
            self.req
                .op(Req::List, path, zk.get_children(path, false))
                .await?
        } else {
            let r = self
                .req
                .op(Req::List, path, zk.get_children(path, true))
                .await?;
            if r.is_some() {
                armed.push(key);
            }
            r
        };
        let bytes: usize = r.iter().flatten().map(String::len).sum();
        self.req.add_bytes(bytes);
        Ok(r)
    }

    /// Lists a root's service directories (those the service filter allows) and the root's
    /// problems; a missing root gets a creation watch.
    pub(crate) async fn list_root(
        &mut self,
        root: &str,
        layout: Layout,
    ) -> Result<(BTreeSet<Dir>, Vec<String>), RegistryError> {
        let zk = Arc::clone(&self.req.zk);
        let ekey = exists_key(root);
        let exists = if self.armed.contains(&ekey) {
            self.req.op(Req::Exists, root, zk.exists(root, false)).await
        } else {
            let r = self.req.op(Req::Exists, root, zk.exists(root, true)).await;
            if r.is_ok() {
                self.armed.insert(ekey);
            }
            r
        };
        // The `exists` just made stamps the root for a full list.
        let stamping = match (&exists, self.stamping) {
            (Ok(st), Stamping::Before) => {
                self.record(root, st.as_ref().and_then(Option::as_ref).map(Stamp::of));
                Stamping::Keep
            }
            (_, s) => s,
        };
        let names = match exists {
            Ok(Some(Some(_))) => {
                let mut newly = Vec::new();
                let r = self.children(root, &mut newly, stamping).await;
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

    /// When ZooKeeper created `path` (`czxid`), if `needed`. Right after a listing that recorded
    /// the directory's stamp (`just_listed` under [`Stamping::Before`], or under
    /// [`Stamping::Keep`] when the running check stamped it) it comes from that stamp;
    /// otherwise it costs one `exists` (an older stamp may predate a re-creation). `None` if
    /// it cannot be read.
    async fn czxid(
        &self,
        path: &str,
        needed: bool,
        just_listed: bool,
    ) -> Result<Option<i64>, RegistryError> {
        if !needed {
            return Ok(None);
        }
        let fresh = match self.stamping {
            Stamping::Before => true,
            Stamping::Keep => self.checked.contains_key(path),
            Stamping::Forget => false,
        };
        if just_listed && fresh {
            if let Some(Some(stamp)) = self.stamp(path) {
                return Ok(Some(stamp.czxid));
            }
        }
        match self
            .req
            .op(Req::Exists, path, self.req.zk.exists(path, false))
            .await
        {
            Ok(Some(Some(stat))) => Ok(Some(stat.czxid)),
            Ok(_) | Err(OpError::Skip(_)) => Ok(None),
            Err(OpError::Fatal(e)) => Err(e),
        }
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
        // or when a check found it (or its `providers`) created again or not stamped since a
        // watch fired: it may have been deleted and created again unseen, and a replica
        // started now dates it anew. Unreadable: undated for now, dated at a later check.
        let redate = [path.clone(), join(&path, "providers")]
            .iter()
            .any(|p| self.checked.get(p) == Some(&true));
        let dating = full || redate || old.is_none_or(|o| !o.dated());
        let (shape, listed) = match known.map(|o| &o.held) {
            Some(Held::Nothing) => {
                let czxid = self.czxid(&path, dating, false).await?;
                return Ok((Read::Unchanged, newly, czxid));
            }
            Some(Held::Providers) => (Shape::Dubbo { providers: true }, false),
            Some(Held::Instances(m)) => (Shape::Curator(m.keys().cloned().collect()), false),
            None => match self.children(&path, &mut newly, self.stamping).await {
                Ok(Some(children)) => (shape(dir, children), true),
                Ok(None) => return Ok((Read::Gone, newly, None)),
                Err(OpError::Fatal(e)) => return Err(e),
                Err(OpError::Skip(p)) => {
                    let read = Read::from(DirState::unreadable(dir.scope(false), p));
                    let czxid = self.czxid(&path, dating, false).await?;
                    return Ok((read, newly, czxid));
                }
            },
        };
        let czxid = self.czxid(&path, dating, listed).await?;
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
        Ok(match self.children(&path, newly, self.stamping).await {
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
                let watch = !self.armed.contains(&key);
                let zk = &self.req.zk;
                async move {
                    let r = self.req.op(Req::Data, &p, zk.get_data(&p, watch)).await;
                    // The data comes with its stat: the stamp of what was read.
                    match &r {
                        Ok(Some((data, st))) => {
                            self.req.add_bytes(data.len());
                            self.record(&p, Some(Stamp::of(st)));
                        }
                        _ => self.forget(&p),
                    }
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

    /// One `exists` per watched znode (`keys`: child watches `c:` and data watches `d:`),
    /// compared with its stamp; the keys to treat as fired (read again). With `rearm` (after a
    /// reconnect, when the client has lost every watch) every child watch is returned, to be
    /// listed again (a child watch is armed only by listing), with the stamp just taken, and
    /// the data watches are armed again by the `exists` itself: unchanged instances are not
    /// read. Without it (the safety pass) nothing is armed, and only what changed, or has no
    /// stamp, is returned.
    pub(crate) async fn check(
        &mut self,
        keys: Vec<String>,
        rearm: bool,
    ) -> Result<Vec<String>, RegistryError> {
        self.checked.clear();
        let results: Vec<_> = {
            let this = &*self;
            stream::iter(keys)
                .map(|key| async move {
                    let path = key.get(2..).unwrap_or("/").to_string();
                    let zk = &this.req.zk;
                    let data = key.starts_with("d:");
                    let r = this
                        .req
                        .op(Req::Exists, &path, zk.exists(&path, rearm && data))
                        .await;
                    (key, path, data, r)
                })
                .buffered(self.concurrency)
                .collect()
                .await
        };
        let mut fired = Vec::new();
        for (key, path, data, r) in results {
            let now = match r {
                Ok(st) => st.flatten().as_ref().map(Stamp::of),
                Err(OpError::Fatal(e)) => return Err(e),
                // exists checks no ACL: not expected; read it again to report it.
                Err(OpError::Skip(_)) => {
                    fired.push(key);
                    continue;
                }
            };
            let before = self.stamp(&path);
            let same = before == Some(now);
            if data {
                if rearm {
                    self.armed.insert(key.clone());
                }
                if !same || !self.armed.contains(&key) {
                    fired.push(key);
                }
            } else if rearm || !same || !self.watches(&key, &path) {
                // Listed next with this stamp (taken before the listing). Created again (or
                // not stamped since a watch fired, so unknown): dated again too.
                let recreated = !matches!(
                    (before, now),
                    (Some(Some(b)), Some(n)) if b.czxid == n.czxid
                );
                self.checked.insert(path.clone(), recreated);
                self.record(&path, now);
                fired.push(key);
            }
        }
        Ok(fired)
    }

    /// Whether the child watch `key` on `path` is armed, or (for a root that does not exist)
    /// the watch for its creation.
    fn watches(&self, key: &str, path: &str) -> bool {
        self.armed.contains(key) || self.armed.contains(&exists_key(path))
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
