//! The scanner's table of listed files: a small [`FileId`] per path, its place in precedence
//! order and its [`FileState`], and each file's duplicate-key problems.
//!
//! [`crate::served`] addresses definitions by these ids, which is why they live apart from the
//! polling loop: an id stays the same while its file is listed, and the id of a file that went
//! is reused only after the scan that dropped it (within that scan it still names the gone file,
//! whose old services are being taken out of the index).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use mcp_core::model::Service;
use tracing::info;

use crate::file_state::FileState;
use crate::served::{Definitions, FileId, Files};

/// One listed file.
#[derive(Debug)]
pub(crate) struct Entry {
    /// Position in precedence order.
    pub(crate) rank: usize,
    pub(crate) state: FileState,
}

/// The listed files by [`FileId`]; ids of files that went are reused.
#[derive(Debug, Default)]
pub(crate) struct Slots {
    /// The entries by id; `None` for a free id.
    entries: Vec<Option<Entry>>,
    /// The id of every path that has an entry.
    ids: HashMap<PathBuf, FileId>,
    /// Ids free for reuse.
    free: Vec<FileId>,
}

impl Slots {
    pub(crate) fn get(&self, id: FileId) -> Option<&Entry> {
        self.entries.get(id).and_then(Option::as_ref)
    }

    pub(crate) fn get_mut(&mut self, id: FileId) -> Option<&mut Entry> {
        self.entries.get_mut(id).and_then(Option::as_mut)
    }

    /// The id of `path`, if it has an entry.
    pub(crate) fn id(&self, path: &Path) -> Option<FileId> {
        self.ids.get(path).copied()
    }

    /// Drops the paths that are not `listed` and takes out their entries, with their ids. The
    /// ids are not free yet: see [`Slots::free`].
    pub(crate) fn release_unlisted(&mut self, listed: &HashSet<&Path>) -> Vec<(FileId, Entry)> {
        let mut released = Vec::new();
        self.ids.retain(|path, &mut id| {
            let keep = listed.contains(path.as_path());
            if !keep {
                info!(file = %path.display(), "File removed; dropping its services.");
                released.push(id);
            }
            keep
        });
        released
            .into_iter()
            .filter_map(|id| {
                let entry = self.entries.get_mut(id).and_then(Option::take)?;
                Some((id, entry))
            })
            .collect()
    }

    /// Makes the ids of released files free for reuse, once nothing refers to them any more.
    pub(crate) fn free(&mut self, ids: impl IntoIterator<Item = FileId>) {
        self.free.extend(ids);
    }

    /// The id and state of `path` (whose id is `id` if it has one), created with no services
    /// at `rank` if it is new.
    pub(crate) fn state(
        &mut self,
        path: &Path,
        rank: usize,
        id: Option<FileId>,
    ) -> (FileId, &mut FileState) {
        let id = id.unwrap_or_else(|| {
            let id = self.free.pop().unwrap_or(self.entries.len());
            self.ids.insert(path.to_path_buf(), id);
            id
        });
        if self.entries.len() <= id {
            self.entries.resize_with(id + 1, || None);
        }
        let entry = self.entries[id].get_or_insert_with(|| Entry {
            rank,
            state: FileState::default(),
        });
        (id, &mut entry.state)
    }

    /// Recomputes the duplicate-key problems of `files` against `definitions`. Whether any
    /// changed.
    pub(crate) fn recheck_duplicates(
        &mut self,
        definitions: &Definitions,
        files: &[FileId],
    ) -> bool {
        let mut changed = false;
        for &file in files {
            let duplicates = definitions.duplicates(file, self);
            if let Some(entry) = self.get_mut(file) {
                if entry.state.duplicates != duplicates {
                    entry.state.duplicates = duplicates;
                    changed = true;
                }
            }
        }
        changed
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
