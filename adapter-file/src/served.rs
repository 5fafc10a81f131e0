//! Which definition of each service key is served, and what a change to some files changes in
//! the served set.
//!
//! Several files (or one file twice) may define the same key; the first definition in
//! precedence order (configured paths in order, directory contents sorted, documents in file
//! order) is served and the others are reported as problems. To turn a scan that changed a few
//! files into `Upsert`/`Remove` events without walking every service, [`Definitions`] keeps, per
//! key, the files that define it in precedence order. It is an index of keys, not a copy of the
//! services: those stay in the scanner's per-file state ([`crate::slots`]), addressed by [`Def`].

use std::collections::{HashMap, HashSet};

use mcp_core::model::{Service, ServiceKey};
use tracing::warn;

/// A file's slot in the scanner; stable while the file is listed.
pub type FileId = usize;

/// One definition of a key: the `index`th service of `file`'s last good version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Def {
    /// The file.
    pub file: FileId,
    /// Position in that file's services.
    pub index: usize,
}

/// What the index needs to know about the files it points into.
pub trait Files {
    /// The last good services of `file` (empty if it has none or is gone).
    fn services(&self, file: FileId) -> &[Service];
    /// `file`'s position in precedence order (lower wins).
    fn rank(&self, file: FileId) -> usize;
}

/// A file whose services changed in this scan, with the services it had before.
#[derive(Debug)]
pub struct Touched {
    /// The file.
    pub file: FileId,
    /// Its services before the scan (what the index still points into).
    pub old: Vec<Service>,
}

/// What a scan changed in the served set.
#[derive(Debug, Default, PartialEq)]
pub struct Delta {
    /// Services served from now on that are new or differ (content or origin) from before, in
    /// precedence order.
    pub upserts: Vec<Service>,
    /// Keys no longer served by any file.
    pub removes: Vec<ServiceKey>,
    /// Files whose duplicate-key problems may have changed: every file defining a key whose
    /// definitions changed.
    pub recheck: Vec<FileId>,
}

/// Per key, the files defining it in precedence order (each file once, at its first definition).
#[derive(Debug, Default)]
pub struct Definitions {
    defs: HashMap<ServiceKey, Vec<Def>>,
}

impl Definitions {
    /// Indexes `files` (in precedence order) from scratch.
    pub fn rebuild(&mut self, order: &[FileId], files: &impl Files) {
        self.defs.clear();
        for &file in order {
            self.add(file, files);
        }
    }

    /// The definition served for `key`, if any file defines it.
    pub fn winner(&self, key: &ServiceKey) -> Option<Def> {
        self.defs.get(key).and_then(|defs| defs.first()).copied()
    }

    /// Every service served, in precedence order.
    pub fn all(&self, order: &[FileId], files: &impl Files) -> Vec<Service> {
        let mut out = Vec::with_capacity(self.defs.len());
        for &file in order {
            for (index, service) in files.services(file).iter().enumerate() {
                if self.winner(&service.key) == Some(Def { file, index }) {
                    out.push(service.clone());
                }
            }
        }
        out
    }

    /// Updates the index for files whose services changed (`files` already holds the new
    /// services; a file that is gone has none) and returns what that changes in the served set.
    pub fn apply(&mut self, touched: &[Touched], files: &impl Files) -> Delta {
        let before: HashMap<FileId, &[Service]> =
            touched.iter().map(|t| (t.file, t.old.as_slice())).collect();
        // Only keys that the touched files define, before or after, can change hands.
        let mut seen = HashSet::new();
        let mut keys: Vec<(&ServiceKey, Option<Def>)> = Vec::new();
        for t in touched {
            for s in files.services(t.file).iter().chain(&t.old) {
                if seen.insert(&s.key) {
                    keys.push((&s.key, self.winner(&s.key)));
                }
            }
        }
        for t in touched {
            self.remove(t.file, &t.old);
        }
        for t in touched {
            self.add(t.file, files);
        }

        let mut delta = Delta::default();
        let mut upserts: Vec<(usize, usize, &Service)> = Vec::new();
        let mut recheck = HashSet::new();
        for (key, old) in keys {
            let Some(defs) = self.defs.get(key) else {
                if old.is_some() {
                    delta.removes.push(key.clone());
                }
                continue;
            };
            recheck.extend(defs.iter().map(|d| d.file));
            let Some(&new) = defs.first() else { continue };
            let untouched = !before.contains_key(&new.file);
            if old == Some(new) && untouched {
                continue;
            }
            let service = &files.services(new.file)[new.index];
            let was = old.and_then(|o| {
                before
                    .get(&o.file)
                    .copied()
                    .unwrap_or_else(|| files.services(o.file))
                    .get(o.index)
            });
            if was != Some(service) {
                upserts.push((files.rank(new.file), new.index, service));
            }
        }
        recheck.extend(touched.iter().map(|t| t.file));
        upserts.sort_by_key(|&(rank, index, _)| (rank, index));
        delta.upserts = upserts.into_iter().map(|(_, _, s)| s.clone()).collect();
        delta.recheck = recheck.into_iter().collect();
        delta
    }

    /// The duplicate-key problems of `file`: one line per service that another definition
    /// shadows, naming the one served.
    pub fn duplicates(&self, file: FileId, files: &impl Files) -> Vec<String> {
        let mut out = Vec::new();
        for (index, service) in files.services(file).iter().enumerate() {
            let Some(winner) = self.winner(&service.key) else {
                continue;
            };
            if winner == (Def { file, index }) {
                continue;
            }
            let first = files
                .services(winner.file)
                .get(winner.index)
                .map_or("?", |s| s.origin.as_str());
            warn!(origin = %service.origin, key = %service.key, first = %first, "Duplicate service ignored.");
            out.push(format!(
                "{}: ignored, {} is already defined by {}",
                service.origin, service.key, first
            ));
        }
        out
    }

    /// Drops `file`'s definitions; `services` are the ones the index was built from.
    fn remove(&mut self, file: FileId, services: &[Service]) {
        for s in services {
            if let Some(defs) = self.defs.get_mut(&s.key) {
                defs.retain(|d| d.file != file);
                if defs.is_empty() {
                    self.defs.remove(&s.key);
                }
            }
        }
    }

    /// Adds `file`'s first definition of each key at its place in precedence order.
    fn add(&mut self, file: FileId, files: &impl Files) {
        let rank = files.rank(file);
        for (index, s) in files.services(file).iter().enumerate() {
            let def = Def { file, index };
            let Some(defs) = self.defs.get_mut(&s.key) else {
                self.defs.insert(s.key.clone(), vec![def]);
                continue;
            };
            if defs.iter().any(|d| d.file == file) {
                continue;
            }
            let at = defs.partition_point(|d| files.rank(d.file) < rank);
            defs.insert(at, def);
        }
    }
}
