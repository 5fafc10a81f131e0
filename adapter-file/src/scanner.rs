//! The polling loop: which files exist, which to read again, and what the files that changed
//! change in the served set.
//!
//! Synchronous so that it can be tested without a runtime and run on a blocking thread. Every
//! scan lists the configured paths ([`crate::walk`]), stats every file and re-reads those that
//! may have changed; what a read does to what that file serves (including waiting for a removal
//! to settle) is [`crate::file_state`]'s rule, and the files' ids and states are kept in
//! [`crate::slots`].
//!
//! A scan reports what it changed in the served set ([`Changes`]), computed from the files that
//! changed only ([`crate::served`]): at a million endpoints, re-deriving the whole set after
//! every edit of one file cost about a second in the core.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use mcp_core::model::{Service, ServiceKey};

use crate::file_state::{Refreshed, Stamp};
use crate::read::{ReadError, Reader};
use crate::served::{Definitions, Delta, FileId, Touched};
use crate::slots::{Entry, Slots};
use crate::walk::{self, scope, StatFailure};

/// How long reads may take and how large files may be, and how long a removal must settle.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// `--read-timeout`.
    pub read_timeout: Duration,
    /// `--max-file-size`.
    pub max_file_size: u64,
    /// `--settle-time`.
    pub settle: Duration,
}

/// What one scan changed.
#[derive(Debug, PartialEq)]
pub struct Scan {
    /// What changed in the served set.
    pub changes: Changes,
    /// Whether the problems ([`Scanner::problems`]) may have changed.
    pub problems: bool,
}

impl Scan {
    /// Whether anything served or reported changed.
    pub fn changed(&self) -> bool {
        self.problems || self.changes != Changes::None
    }
}

/// What changed in the served set.
#[derive(Debug, PartialEq)]
pub enum Changes {
    /// Nothing.
    None,
    /// Everything may have: the set was derived from scratch (the first scan, or files changed
    /// places in precedence order); send [`Scanner::served`] in full.
    All,
    /// These services are new or changed and these keys are gone.
    Some {
        /// New or changed services, in precedence order.
        upserts: Vec<Service>,
        /// Keys no longer served.
        removes: Vec<ServiceKey>,
    },
}

/// Polls the configured paths; see the module documentation.
#[derive(Debug)]
pub struct Scanner {
    roots: Vec<PathBuf>,
    reader: Reader,
    settle: Duration,
    /// Files found in the last scan, in precedence order (configured order, then sorted).
    order: Vec<PathBuf>,
    /// The ids of the files in `order`, by position (`None` for one with no state yet).
    order_ids: Vec<Option<FileId>>,
    /// The state of the listed files (those in `order` that could be looked at), by id.
    slots: Slots,
    /// Per key, the files defining it in precedence order; `None` until the first scan
    /// derives it.
    definitions: Option<Definitions>,
    /// Problems with configured paths and directories themselves (missing, unreadable).
    path_problems: BTreeMap<String, Vec<String>>,
}

impl Scanner {
    /// A scanner of `roots` that has not looked at anything yet.
    pub fn new(roots: Vec<PathBuf>, limits: Limits) -> Self {
        Self::with_reader(
            roots,
            Reader::new(limits.read_timeout, limits.max_file_size),
            limits.settle,
        )
    }

    /// [`Scanner::new`] with a given reader (tests substitute one that blocks).
    pub fn with_reader(roots: Vec<PathBuf>, reader: Reader, settle: Duration) -> Self {
        Self {
            roots,
            reader,
            settle,
            order: Vec::new(),
            order_ids: Vec::new(),
            slots: Slots::default(),
            definitions: None,
            path_problems: BTreeMap::new(),
        }
    }

    /// Stats every path, re-reads what changed and works out what that changed in the served
    /// set. When nothing changed this costs one `stat` per file and no per-service work.
    pub fn scan(&mut self) -> Scan {
        let listing = walk::list(&self.roots, &self.order);
        let mut problems = listing.problems != self.path_problems;
        let mut touched = Vec::new();
        let mut released = Vec::new();
        let same = listing.files.len() == self.order.len()
            && listing
                .files
                .iter()
                .zip(&self.order)
                .all(|(f, p)| f.path == *p);
        // The ids by position: looked up by path (hashing every path) only if the list changed.
        let mut ids = if same {
            std::mem::take(&mut self.order_ids)
        } else {
            let seen: HashSet<&Path> = listing.files.iter().map(|f| f.path.as_path()).collect();
            for (id, entry) in self.slots.release_unlisted(&seen) {
                problems |= entry.state.has_problems();
                touched.push(Touched {
                    file: id,
                    old: entry.state.good,
                });
                released.push(id);
            }
            listing
                .files
                .iter()
                .map(|f| self.slots.id(&f.path))
                .collect()
        };
        // Files keep their relative order unless a path changed how it is listed (a file
        // reached through two configured paths, a broken directory held): then every winner
        // may change and the set is derived again.
        let mut reordered = false;
        let mut last_rank = None;
        for (rank, (listed, id)) in listing.files.iter().zip(ids.iter_mut()).enumerate() {
            if let Some(entry) = id.and_then(|id| self.slots.get_mut(id)) {
                reordered |= last_rank.is_some_and(|last| entry.rank < last);
                last_rank = Some(entry.rank);
                entry.rank = rank;
            }
            // Held below a path that cannot be listed: keep the file as it was, do not touch it.
            let Some(meta) = &listed.meta else {
                continue;
            };
            let (file, refreshed) = self.refresh(&listed.path, meta, rank, *id);
            *id = file;
            match refreshed {
                Refreshed::Same => {}
                Refreshed::Error => problems = true,
                Refreshed::Services { old, fixed } => {
                    problems |= fixed;
                    if let Some(file) = file {
                        touched.push(Touched { file, old });
                    }
                }
            }
        }
        self.order = listing.files.into_iter().map(|f| f.path).collect();
        self.order_ids = ids;
        self.path_problems = listing.problems;

        let changes = match &mut self.definitions {
            Some(definitions) if !reordered => {
                if touched.is_empty() {
                    Changes::None
                } else {
                    let delta = definitions.apply(&touched, &self.slots);
                    problems |= self.slots.recheck_duplicates(definitions, &delta.recheck);
                    let Delta {
                        upserts, removes, ..
                    } = delta;
                    if upserts.is_empty() && removes.is_empty() {
                        Changes::None
                    } else {
                        Changes::Some { upserts, removes }
                    }
                }
            }
            _ => {
                let order = self.order_ids();
                let definitions = self.definitions.get_or_insert_with(Definitions::default);
                definitions.rebuild(&order, &self.slots);
                self.slots.recheck_duplicates(definitions, &order);
                problems = true;
                Changes::All
            }
        };
        self.slots.free(released);
        Scan { changes, problems }
    }

    /// The ids of the listed files, in precedence order.
    fn order_ids(&self) -> Vec<FileId> {
        self.order_ids.iter().flatten().copied().collect()
    }

    /// Re-reads one file (at `rank` in precedence order, with the metadata the listing found
    /// and its id if it has one) if it may have changed. Returns its id if it has one now.
    fn refresh(
        &mut self,
        path: &Path,
        meta: &fs::Metadata,
        rank: usize,
        id: Option<FileId>,
    ) -> (Option<FileId>, Refreshed) {
        let stamp = Stamp::of(meta);
        if let Some(Entry { state, .. }) = id.and_then(|id| self.slots.get(id)) {
            if !state.may_have_changed(stamp) && !self.reader.is_stuck(path) {
                return (id, Refreshed::Same);
            }
        }
        let read_at = SystemTime::now();
        let result = self.reader.read(path, meta);
        if let Err(ReadError::Io(e)) = &result {
            if matches!(walk::classify(path, e), StatFailure::Gone) {
                // Deleted between the listing's stat and this read: a deletion, not a file
                // that cannot be read. The next scan's listing finds it gone and removes its
                // services and reports the path in one scan, in that order; reported here,
                // the problem would go out a poll before the removal.
                return (id, Refreshed::Same);
            }
        }
        let settle = self.settle;
        let (file, state) = self.slots.state(path, rank, id);
        state.read(stamp, read_at);
        (Some(file), state.update(path, result, settle))
    }

    /// The services to serve (the first definition of each key), in precedence order.
    pub fn served(&self) -> Vec<Service> {
        self.definitions
            .as_ref()
            .map_or_else(Vec::new, |definitions| {
                definitions.all(&self.order_ids(), &self.slots)
            })
    }

    /// The problems per scope: paths that cannot be listed, files that cannot be used (their
    /// last good services stay) and services shadowed by another definition of their key.
    pub fn problems(&self) -> BTreeMap<String, Vec<String>> {
        let mut problems = self.path_problems.clone();
        for (path, id) in self.order.iter().zip(&self.order_ids) {
            let Some(Entry { state, .. }) = id.and_then(|id| self.slots.get(id)) else {
                continue;
            };
            if !state.has_problems() {
                continue;
            }
            let list = problems.entry(scope(path)).or_default();
            list.extend(state.problems().cloned());
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::read::ReadError;
    use crate::test_support::{names, one_file, problems, se, write, LIMITS};

    #[test]
    fn special_files_are_problems_and_do_not_block_the_rest() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a.yaml");
        write(&a, &se("web", 80));
        let status = std::process::Command::new("mkfifo")
            .arg(dir.path().join("pipe.yaml"))
            .status()
            .expect("mkfifo");
        assert!(status.success());
        std::os::unix::fs::symlink("/dev/zero", dir.path().join("zero.yaml")).expect("ln");
        let mut scanner = Scanner::new(vec![dir.path().to_path_buf()], LIMITS);
        assert!(scanner.scan().changed());
        assert_eq!(names(&scanner), vec!["web"]);
        let p = problems(&scanner);
        assert!(
            p.contains("pipe.yaml: not a regular file: named pipe"),
            "{p}"
        );
        assert!(
            p.contains("zero.yaml: not a regular file: character device"),
            "{p}"
        );
        write(&a, &se("web", 8080));
        assert!(scanner.scan().changed());
        assert_eq!(scanner.served()[0].ports[0].number, 8080);
    }

    /// Reads started by [`stuck_read`].
    static STUCK_READS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    /// A read that never finishes within the test's timeout (counted).
    fn stuck_read(_: &Path, _: u64) -> Result<String, ReadError> {
        STUCK_READS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(30));
        Ok(String::new())
    }

    #[test]
    fn a_stuck_read_is_a_problem_and_keeps_the_last_good_content() {
        let (_dir, a, mut scanner) = one_file();
        // The same scanner state, now with reads that hang (a hung network mount).
        scanner.reader = Reader::with_read_fn(Duration::from_millis(20), 1024, stuck_read);
        write(&a, &se("web", 81));
        assert!(scanner.scan().changed());
        assert_eq!(scanner.served()[0].ports[0].number, 80);
        let p = problems(&scanner);
        assert!(p.contains("a.yaml: read timed out after 0.02s"), "{p}");
        assert_eq!(STUCK_READS.load(std::sync::atomic::Ordering::SeqCst), 1);
        // Still stuck: no change, and no second read of the file is started (so none is
        // waited for).
        assert!(!scanner.scan().changed());
        assert_eq!(
            STUCK_READS.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "a second read of a stuck file"
        );
    }

    /// Set by the test that deletes a file while it is read.
    static DELETE_BEFORE_READ: std::sync::atomic::AtomicBool =
        std::sync::atomic::AtomicBool::new(false);

    /// A read that, when [`DELETE_BEFORE_READ`] is set, deletes the file first: the deletion
    /// lands between the listing's stat and the read.
    fn read_after_a_deletion(path: &Path, limit: u64) -> Result<String, ReadError> {
        if DELETE_BEFORE_READ.load(std::sync::atomic::Ordering::SeqCst) {
            fs::remove_file(path).expect("rm while reading");
        }
        crate::read::read_regular(path, limit)
    }

    #[test]
    fn a_file_deleted_while_it_is_read_is_a_deletion_not_a_read_problem() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a.yaml");
        write(&a, &se("web", 80));
        let mut scanner = Scanner::with_reader(
            vec![a.clone()],
            Reader::with_read_fn(
                LIMITS.read_timeout,
                LIMITS.max_file_size,
                read_after_a_deletion,
            ),
            LIMITS.settle,
        );
        assert!(scanner.scan().changed());
        assert_eq!(names(&scanner), vec!["web"]);

        DELETE_BEFORE_READ.store(true, std::sync::atomic::Ordering::SeqCst);
        write(&a, &se("web", 8080));
        let raced = scanner.scan();
        DELETE_BEFORE_READ.store(false, std::sync::atomic::Ordering::SeqCst);
        assert!(!a.exists(), "the read deleted the file");
        // Nothing yet: no "cannot read" problem, the services as they were.
        assert!(!raced.changed() && !raced.problems, "{:?}", raced.changes);
        assert_eq!(problems(&scanner), "{}");
        assert_eq!(names(&scanner), vec!["web"]);

        // The next scan: the removal and the missing path, together.
        let gone = scanner.scan();
        assert!(
            matches!(&gone.changes, Changes::Some { upserts, removes } if upserts.is_empty() && removes.len() == 1),
            "{:?}",
            gone.changes
        );
        assert!(gone.problems);
        assert!(names(&scanner).is_empty());
        let p = problems(&scanner);
        assert!(p.contains("does not exist"), "{p}");
        assert!(!p.contains("cannot read"), "{p}");
    }

    #[test]
    fn deletion_is_applied_at_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a.yaml");
        write(&a, &se("web", 80));
        let limits = Limits {
            settle: Duration::from_secs(60),
            ..LIMITS
        };
        let mut scanner = Scanner::new(vec![dir.path().to_path_buf()], limits);
        assert!(scanner.scan().changed());
        fs::remove_file(&a).expect("rm");
        assert!(scanner.scan().changed());
        assert!(names(&scanner).is_empty());
    }

    #[test]
    fn unlistable_paths_keep_their_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conf = dir.path().join("conf");
        fs::create_dir_all(conf.join("sub")).expect("mkdir");
        write(&conf.join("sub/s.yaml"), &se("s", 80));
        let link = dir.path().join("link.yaml");
        let target = dir.path().join("target.yaml");
        write(&target, &se("l", 80));
        std::os::unix::fs::symlink(&target, &link).expect("ln");
        let mut scanner = Scanner::new(vec![conf.clone(), link.clone()], LIMITS);
        assert!(scanner.scan().changed());
        assert_eq!(names(&scanner), vec!["s", "l"]);

        fs::rename(conf.join("sub"), conf.join(".old")).expect("mv");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), conf.join("sub")).expect("ln");
        fs::remove_file(&target).expect("rm target");
        assert!(scanner.scan().changed());
        assert_eq!(names(&scanner), vec!["s", "l"]);
        let p = problems(&scanner);
        assert!(p.contains("sub: cannot stat: dangling symlink"), "{p}");
        assert!(
            p.contains("link.yaml: cannot stat: dangling symlink"),
            "{p}"
        );
    }
}
