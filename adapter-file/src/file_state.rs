//! One file across polls: whether it may have changed since it was last read, and what a new
//! read does to what it serves.
//!
//! A file is re-read when its (mtime, size, inode) [`Stamp`] changed, or when it changed so
//! recently that a second write within the same mtime tick could have gone unnoticed (see
//! [`RACY_WINDOW`]).
//!
//! What a file serves only ever changes to a version that converted without error. On top of
//! that, a version that would take services away (an empty file, fewer documents) or that no
//! longer parses is applied only once the same content has been read again `settle` later:
//! editors and `kubectl cp` truncate a file before they write it, and for one poll it would
//! otherwise look as if its services were deleted.
//!
//! Apart from [`crate::scanner`] because this is the rule for one file on its own: it knows
//! nothing of listing, file ids or which definition of a key wins; the scanner decides when a
//! file is looked at and feeds the result of reading it here.

use std::collections::HashSet;
use std::fs;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use mcp_core::model::{Service, ServiceKey};
use tracing::{debug, info, warn};

use crate::convert::{self, ConvertError, Format};
use crate::read::ReadError;
use crate::walk::scope;

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

/// What identifies one version of a file without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stamp {
    mtime: Option<SystemTime>,
    size: u64,
    inode: u64,
}

impl Stamp {
    /// The stamp of the version `meta` describes.
    pub(crate) fn of(meta: &fs::Metadata) -> Self {
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
pub(crate) struct FileState {
    /// Stamp of the version last read; `None` if it could not be stat'ed.
    stamp: Option<Stamp>,
    /// Read again next poll even if the stamp is unchanged.
    racy: bool,
    /// Services of the last version that converted without error.
    pub(crate) good: Vec<Service>,
    /// Why the current version is not used, if it is not.
    error: Option<String>,
    /// A version waiting to settle (read again every poll until it is applied or replaced).
    candidate: Option<Candidate>,
    /// Its services that another definition of the same key shadows, as problem lines.
    pub(crate) duplicates: Vec<String>,
}

/// What a new read did to one file.
#[derive(Debug)]
pub(crate) enum Refreshed {
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
    /// Whether the version now stamped `stamp` may differ from what was made of the last read:
    /// its stamp changed, it was young when read, or a version is waiting to settle.
    pub(crate) fn may_have_changed(&self, stamp: Stamp) -> bool {
        let unchanged = self.stamp == Some(stamp) && !self.racy;
        !unchanged || self.candidate.is_some()
    }

    /// Records that the version stamped `stamp` was read at `read_at`.
    pub(crate) fn read(&mut self, stamp: Stamp, read_at: SystemTime) {
        self.stamp = Some(stamp);
        self.racy = stamp.mtime.is_none_or(|mtime| {
            read_at
                .duration_since(mtime)
                .map_or(true, |age| age < RACY_WINDOW)
        });
    }

    /// Whether it has problems to report (an error, shadowed services).
    pub(crate) fn has_problems(&self) -> bool {
        self.error.is_some() || !self.duplicates.is_empty()
    }

    /// Its problems as reported: its error, then its shadowed services.
    pub(crate) fn problems(&self) -> impl Iterator<Item = &String> {
        self.error.iter().chain(&self.duplicates)
    }

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
    pub(crate) fn update(
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
    use std::fs;
    use std::time::{Duration, SystemTime};

    use crate::scanner::{Limits, Scanner};
    use crate::test_support::{names, one_file, problems, se, set_mtime, write, LIMITS};

    #[test]
    fn only_changed_stamps_are_reread() {
        let (_dir, a, mut scanner) = one_file();
        let old = SystemTime::now() - Duration::from_secs(60);
        // New mtime, same content: re-read, but nothing changed.
        set_mtime(&a, old);
        assert!(!scanner.scan().changed());

        // Same size, same inode, mtime put back: the stamp is unchanged, so the file is not
        // re-read (the price of polling with stat only).
        write(&a, &se("web", 81));
        set_mtime(&a, old);
        assert!(!scanner.scan().changed());
        assert_eq!(scanner.served()[0].ports[0].number, 80);

        // Any stamp change makes it re-read.
        set_mtime(&a, old + Duration::from_secs(1));
        assert!(scanner.scan().changed());
        assert_eq!(scanner.served()[0].ports[0].number, 81);
    }

    #[test]
    fn recently_modified_files_are_reread_once_more() {
        let (_dir, a, mut scanner) = one_file();
        // A same-size rewrite within the same mtime tick: caught because the file was young.
        let mtime = fs::metadata(&a).and_then(|m| m.modified()).expect("mtime");
        write(&a, &se("web", 81));
        set_mtime(&a, mtime);
        assert!(scanner.scan().changed());
        assert_eq!(scanner.served()[0].ports[0].number, 81);
    }

    #[test]
    fn a_file_that_becomes_a_pipe_keeps_its_services() {
        let (_dir, a, mut scanner) = one_file();
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
}
