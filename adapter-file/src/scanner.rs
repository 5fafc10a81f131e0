//! The polling state machine: which files exist, which changed, what each one serves.
//!
//! Synchronous so that it can be tested without a runtime and run on a blocking thread. Every
//! scan lists the configured paths ([`crate::walk`]), stats every file and re-reads those whose
//! (mtime, size, inode) changed, or that changed so recently that a second write within the
//! same mtime tick could have gone unnoticed (see [`RACY_WINDOW`]).
//!
//! What a file serves only ever changes to a version that converted without error. On top of
//! that, a version that would take services away (an empty file, fewer documents) or that no
//! longer parses is applied only once the same content has been read again `settle` later:
//! editors and `kubectl cp` truncate a file before they write it, and for one poll it would
//! otherwise look as if its services were deleted.
//!
//! A scan reports what it changed in the served set ([`Changes`]), computed from the files that
//! changed only ([`crate::served`]): at a million endpoints, re-deriving the whole set after
//! every edit of one file cost about a second in the core.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use mcp_core::model::{Service, ServiceKey};
use tracing::{debug, info, warn};

use crate::convert::{self, ConvertError, Format};
use crate::read::{ReadError, Reader};
use crate::served::{Delta, FileId, Files, Served, Touched};
use crate::walk::{self, scope};

/// Files whose mtime is younger than this when read are read again on the next poll even if
/// their stamp did not change: file systems with coarse mtimes can hide a second same-size write.
const RACY_WINDOW: Duration = Duration::from_secs(2);

/// Why one file could not be used this time; reported as a problem, never fatal.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file could not be read: not a regular file, too large, stuck, or an I/O error.
    #[error("file {path}: {source}")]
    Read {
        /// The file, as configured.
        path: String,
        /// What went wrong.
        source: ReadError,
    },
    /// The file was read but one of its documents is invalid.
    #[error(transparent)]
    Convert(#[from] ConvertError),
}

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

/// What identifies one version of a file without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    mtime: Option<SystemTime>,
    size: u64,
    inode: u64,
}

impl Stamp {
    fn of(meta: &fs::Metadata) -> Self {
        #[cfg(unix)]
        let inode = std::os::unix::fs::MetadataExt::ino(meta);
        #[cfg(not(unix))]
        let inode = 0;
        Self {
            mtime: meta.modified().ok(),
            size: meta.len(),
            inode,
        }
    }
}

/// A version read but not applied yet because it would remove services or does not parse.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    /// Hash of its text: the same hash on a later read means the write is over.
    digest: u64,
    /// When it was first read.
    first_read: Instant,
}

/// Per-file state kept between polls.
#[derive(Debug, Default)]
struct FileState {
    /// Stamp of the version last read; `None` if it could not be stat'ed.
    stamp: Option<Stamp>,
    /// Read again next poll even if the stamp is unchanged.
    racy: bool,
    /// Services of the last version that converted without error.
    good: Vec<Service>,
    /// Why the current version is not used, if it is not.
    error: Option<String>,
    /// A version waiting to settle (read again every poll until it is applied or replaced).
    candidate: Option<Candidate>,
    /// Its services that another definition of the same key shadows, as problem lines.
    duplicates: Vec<String>,
}

/// What [`Scanner::refresh`] did to one file.
#[derive(Debug)]
enum Refreshed {
    /// Nothing that is served or reported.
    Same,
    /// Only its error (a problem) changed.
    Error,
    /// Its services changed (and maybe its error was cleared).
    Services {
        /// The services it had.
        old: Vec<Service>,
        /// Whether it had an error, now gone.
        fixed: bool,
    },
}

impl FileState {
    /// Records an error for this file (its last good services stay).
    fn fail(&mut self, path: &Path, error: &FileError) -> Refreshed {
        let message = error.to_string();
        let changed = self.error.as_deref() != Some(message.as_str());
        if changed {
            warn!(
                file = %path.display(),
                error = %error,
                kept_services = self.good.len(),
                "Skipping bad file; serving its last good services."
            );
        }
        self.error = Some(message);
        if changed {
            Refreshed::Error
        } else {
            Refreshed::Same
        }
    }

    /// Takes in a new read of the file: applies it, records its error, or waits for it to settle.
    fn update(
        &mut self,
        path: &Path,
        result: Result<String, ReadError>,
        settle: Duration,
    ) -> Refreshed {
        let text = match result {
            Ok(text) => text,
            Err(source) => {
                // Not content: nothing to settle. The last good services stay.
                self.candidate = None;
                let error = FileError::Read {
                    path: scope(path),
                    source,
                };
                return self.fail(path, &error);
            }
        };
        let parsed = convert::parse(&scope(path), &text, Format::for_path(path));
        let takes_away = match &parsed {
            Ok(services) => removes_any(&self.good, services),
            Err(_) => !self.good.is_empty(),
        };
        if takes_away && !settle.is_zero() {
            let digest = digest(&text);
            let now = Instant::now();
            match self.candidate {
                Some(c) if c.digest == digest && now.duration_since(c.first_read) >= settle => {
                    debug!(file = %path.display(), "Removal settled; applying it.");
                }
                Some(c) if c.digest == digest => return Refreshed::Same,
                _ => {
                    debug!(
                        file = %path.display(),
                        settle_ms = settle.as_millis(),
                        "New version would remove services; waiting for it to settle."
                    );
                    self.candidate = Some(Candidate {
                        digest,
                        first_read: now,
                    });
                    return Refreshed::Same;
                }
            }
        }
        self.candidate = None;
        match parsed {
            Ok(services) => self.apply(path, services),
            Err(e) => self.fail(path, &FileError::Convert(e)),
        }
    }

    /// Serves `services` from now on.
    fn apply(&mut self, path: &Path, services: Vec<Service>) -> Refreshed {
        let fixed = self.error.take().is_some();
        if fixed {
            info!(file = %path.display(), services = services.len(), "File is good again.");
        }
        if self.good == services {
            return if fixed {
                Refreshed::Error
            } else {
                Refreshed::Same
            };
        }
        debug!(file = %path.display(), services = services.len(), "File read.");
        Refreshed::Services {
            old: std::mem::replace(&mut self.good, services),
            fixed,
        }
    }
}

/// One listed file.
#[derive(Debug)]
struct Entry {
    /// Position in precedence order.
    rank: usize,
    state: FileState,
}

/// The listed files by [`FileId`]; ids of files that went are reused.
#[derive(Debug, Default)]
struct Slots(Vec<Option<Entry>>);

impl Slots {
    fn get(&self, id: FileId) -> Option<&Entry> {
        self.0.get(id).and_then(Option::as_ref)
    }

    fn get_mut(&mut self, id: FileId) -> Option<&mut Entry> {
        self.0.get_mut(id).and_then(Option::as_mut)
    }
}

impl Files for Slots {
    fn services(&self, file: FileId) -> &[Service] {
        self.get(file).map_or(&[], |e| e.state.good.as_slice())
    }

    fn rank(&self, file: FileId) -> usize {
        self.get(file).map_or(usize::MAX, |e| e.rank)
    }
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
    ids: HashMap<PathBuf, FileId>,
    slots: Slots,
    /// Slots free for reuse.
    free: Vec<FileId>,
    /// Which definition of each key is served; `None` until the first scan derives it.
    served: Option<Served>,
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
            ids: HashMap::new(),
            slots: Slots::default(),
            free: Vec::new(),
            served: None,
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
            self.ids.retain(|path, &mut id| {
                let keep = seen.contains(path.as_path());
                if !keep {
                    info!(file = %path.display(), "File removed; dropping its services.");
                    released.push(id);
                }
                keep
            });
            listing
                .files
                .iter()
                .map(|f| self.ids.get(&f.path).copied())
                .collect()
        };
        for &id in &released {
            let entry = self.slots.0.get_mut(id).and_then(Option::take);
            if let Some(entry) = entry {
                problems |= entry.state.error.is_some() || !entry.state.duplicates.is_empty();
                touched.push(Touched {
                    file: id,
                    old: entry.state.good,
                });
            }
        }
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

        let changes = match &mut self.served {
            Some(served) if !reordered => {
                if touched.is_empty() {
                    Changes::None
                } else {
                    let delta = served.apply(&touched, &self.slots);
                    problems |= self.recheck_duplicates(&delta.recheck);
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
                let served = self.served.get_or_insert_with(Served::default);
                served.rebuild(&order, &self.slots);
                self.recheck_duplicates(&order);
                problems = true;
                Changes::All
            }
        };
        self.free.extend(released);
        Scan { changes, problems }
    }

    /// The ids of the listed files, in precedence order.
    fn order_ids(&self) -> Vec<FileId> {
        self.order_ids.iter().flatten().copied().collect()
    }

    /// Recomputes the duplicate-key problems of `files`. Whether any changed.
    fn recheck_duplicates(&mut self, files: &[FileId]) -> bool {
        let Some(served) = &self.served else {
            return false;
        };
        let mut changed = false;
        for &file in files {
            let duplicates = served.duplicates(file, &self.slots);
            if let Some(entry) = self.slots.get_mut(file) {
                if entry.state.duplicates != duplicates {
                    entry.state.duplicates = duplicates;
                    changed = true;
                }
            }
        }
        changed
    }

    /// The id and state of `path` (whose id is `id` if it has one), created with no services
    /// if it is new.
    fn state(&mut self, path: &Path, rank: usize, id: Option<FileId>) -> (FileId, &mut FileState) {
        let id = id.unwrap_or_else(|| {
            let id = self.free.pop().unwrap_or(self.slots.0.len());
            self.ids.insert(path.to_path_buf(), id);
            id
        });
        if self.slots.0.len() <= id {
            self.slots.0.resize_with(id + 1, || None);
        }
        let entry = self.slots.0[id].get_or_insert_with(|| Entry {
            rank,
            state: FileState::default(),
        });
        (id, &mut entry.state)
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
            let unchanged = state.stamp == Some(stamp) && !state.racy;
            if unchanged && state.candidate.is_none() && !self.reader.is_stuck(path) {
                return (id, Refreshed::Same);
            }
        }
        let read_at = SystemTime::now();
        let result = self.reader.read(path, meta);
        let settle = self.settle;
        let (file, state) = self.state(path, rank, id);
        state.stamp = Some(stamp);
        state.racy = stamp.mtime.is_none_or(|mtime| {
            read_at
                .duration_since(mtime)
                .map_or(true, |age| age < RACY_WINDOW)
        });
        (Some(file), state.update(path, result, settle))
    }

    /// The services to serve (the first definition of each key), in precedence order.
    pub fn served(&self) -> Vec<Service> {
        self.served.as_ref().map_or_else(Vec::new, |served| {
            served.all(&self.order_ids(), &self.slots)
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
            if state.error.is_none() && state.duplicates.is_empty() {
                continue;
            }
            let list = problems.entry(scope(path)).or_default();
            list.extend(state.error.iter().cloned());
            list.extend(state.duplicates.iter().cloned());
        }
        problems
    }
}

/// Whether `new` lacks a service that `old` has.
fn removes_any(old: &[Service], new: &[Service]) -> bool {
    let kept: HashSet<&ServiceKey> = new.iter().map(|s| &s.key).collect();
    old.iter().any(|s| !kept.contains(&s.key))
}

fn digest(text: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    text.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        read_timeout: Duration::from_secs(5),
        max_file_size: 1024 * 1024,
        settle: Duration::ZERO,
    };

    fn se(name: &str, port: u32) -> String {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}}}\n\
             spec:\n  hosts: [{name}.example.com]\n  ports: [{{number: {port}, name: http}}]\n"
        )
    }

    fn write(path: &Path, text: &str) {
        fs::write(path, text).expect("write test file");
    }

    fn names(scanner: &Scanner) -> Vec<String> {
        scanner.served().iter().map(|s| s.key.to_string()).collect()
    }

    fn problems(scanner: &Scanner) -> String {
        format!("{:?}", scanner.problems())
    }

    #[test]
    fn only_changed_stamps_are_reread() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a.yaml");
        let set_mtime = |t: SystemTime| {
            fs::File::options()
                .write(true)
                .open(&a)
                .and_then(|f| f.set_modified(t))
                .expect("set mtime");
        };
        let old = SystemTime::now() - Duration::from_secs(60);
        write(&a, &se("web", 80));
        let mut scanner = Scanner::new(vec![a.clone()], LIMITS);
        assert!(scanner.scan().changed());
        // New mtime, same content: re-read, but nothing changed.
        set_mtime(old);
        assert!(!scanner.scan().changed());

        // Same size, same inode, mtime put back: the stamp is unchanged, so the file is not
        // re-read (the price of polling with stat only).
        write(&a, &se("web", 81));
        set_mtime(old);
        assert!(!scanner.scan().changed());
        assert_eq!(scanner.served()[0].ports[0].number, 80);

        // Any stamp change makes it re-read.
        set_mtime(old + Duration::from_secs(1));
        assert!(scanner.scan().changed());
        assert_eq!(scanner.served()[0].ports[0].number, 81);
    }

    #[test]
    fn recently_modified_files_are_reread_once_more() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a.yaml");
        write(&a, &se("web", 80));
        let mut scanner = Scanner::new(vec![a.clone()], LIMITS);
        assert!(scanner.scan().changed());
        // A same-size rewrite within the same mtime tick: caught because the file was young.
        let mtime = fs::metadata(&a).and_then(|m| m.modified()).expect("mtime");
        write(&a, &se("web", 81));
        fs::File::options()
            .write(true)
            .open(&a)
            .and_then(|f| f.set_modified(mtime))
            .expect("set mtime");
        assert!(scanner.scan().changed());
        assert_eq!(scanner.served()[0].ports[0].number, 81);
    }

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

    #[test]
    fn a_file_that_becomes_a_pipe_keeps_its_services() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a.yaml");
        write(&a, &se("web", 80));
        let mut scanner = Scanner::new(vec![a.clone()], LIMITS);
        assert!(scanner.scan().changed());
        fs::remove_file(&a).expect("rm");
        let status = std::process::Command::new("mkfifo")
            .arg(&a)
            .status()
            .expect("mkfifo");
        assert!(status.success());
        assert!(scanner.scan().changed());
        assert_eq!(names(&scanner), vec!["web"]);
        assert!(problems(&scanner).contains("named pipe"));
    }

    /// A read that never finishes within the test's timeout.
    fn stuck_read(_: &Path, _: u64) -> Result<String, ReadError> {
        std::thread::sleep(Duration::from_secs(30));
        Ok(String::new())
    }

    #[test]
    fn a_stuck_read_is_a_problem_and_keeps_the_last_good_content() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a.yaml");
        write(&a, &se("web", 80));
        let mut scanner = Scanner::new(vec![a.clone()], LIMITS);
        assert!(scanner.scan().changed());
        // The same scanner state, now with reads that hang (a hung network mount).
        scanner.reader = Reader::with_read_fn(Duration::from_millis(20), 1024, stuck_read);
        write(&a, &se("web", 81));
        assert!(scanner.scan().changed());
        assert_eq!(scanner.served()[0].ports[0].number, 80);
        let p = problems(&scanner);
        assert!(p.contains("a.yaml: read timed out after 0.02s"), "{p}");
        // Still stuck: no change, answered without waiting again.
        let start = Instant::now();
        assert!(!scanner.scan().changed());
        assert!(start.elapsed() < Duration::from_millis(20));
    }

    #[test]
    fn removals_and_parse_errors_wait_for_the_content_to_settle() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a.yaml");
        write(&a, &format!("{}---\n{}", se("web", 80), se("api", 80)));
        let settle = Duration::from_millis(200);
        let mut scanner = Scanner::new(vec![a.clone()], Limits { settle, ..LIMITS });
        assert!(scanner.scan().changed());
        assert_eq!(names(&scanner), vec!["web", "api"]);

        // Truncated mid-write: neither applied nor reported at first.
        write(&a, "");
        assert!(!scanner.scan().changed());
        write(&a, "apiVersion: networking.istio.io/v1\nkind: ServiceEn");
        assert!(!scanner.scan().changed());
        assert_eq!(problems(&scanner), "{}");
        // The write completes; additions and edits apply at once.
        write(&a, &format!("{}---\n{}", se("web", 81), se("api", 80)));
        assert!(scanner.scan().changed());
        assert_eq!(scanner.served()[0].ports[0].number, 81);

        // A document removed on purpose: applied once the same content is read after `settle`.
        write(&a, &se("web", 81));
        assert!(!scanner.scan().changed());
        assert_eq!(names(&scanner), vec!["web", "api"]);
        std::thread::sleep(settle);
        assert!(scanner.scan().changed());
        assert_eq!(names(&scanner), vec!["web"]);

        // A broken version that stays: reported after `settle`, last good kept.
        write(&a, "kind: [broken\n");
        assert!(!scanner.scan().changed());
        std::thread::sleep(settle);
        assert!(scanner.scan().changed());
        assert!(problems(&scanner).contains("YAML syntax error"));
        assert_eq!(names(&scanner), vec!["web"]);

        // Emptied on purpose: applied after `settle`; a deletion at once.
        write(&a, "");
        assert!(!scanner.scan().changed());
        std::thread::sleep(settle);
        assert!(scanner.scan().changed());
        assert!(names(&scanner).is_empty());
        assert_eq!(problems(&scanner), "{}");
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
