//! Listing: which files the configured paths stand for in this scan.
//!
//! A path that is gone (`ENOENT` and no symlink left behind) is a deletion: its files are
//! dropped. A path that exists but cannot be stat'ed or listed (a dangling symlink left by a
//! half-done swap, a path component that became a regular file, `EACCES`, `EIO`) is not: the
//! files previously found below it are *held* (kept with their last good content, not re-read)
//! and the path is reported as a problem naming the OS error.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Symlinked directories could form loops; nobody nests configuration deeper than this.
const MAX_DEPTH: usize = 16;

/// Extensions picked up inside directories (a path named explicitly is read whatever its name).
const EXTENSIONS: [&str; 3] = ["yaml", "yml", "json"];

/// One file found by a scan.
#[derive(Debug)]
pub struct Listed {
    /// The file, as configured or joined below a configured directory.
    pub path: PathBuf,
    /// Its metadata (following symlinks) from the listing, so that it is not stat'ed twice per
    /// poll; `None` for a held file.
    pub meta: Option<fs::Metadata>,
}

/// What one scan of the configured paths found.
#[derive(Debug, Default)]
pub struct Listing {
    /// Files in precedence order (configured order, directory contents sorted), each once.
    pub files: Vec<Listed>,
    /// Files below a path that could not be stat'ed or listed: keep their state as it is.
    pub held: HashSet<PathBuf>,
    /// Problems with configured paths and directories themselves, by scope.
    pub problems: BTreeMap<String, Vec<String>>,
}

/// How a path is named in `Problems` scopes and messages: as configured (or joined below a
/// configured directory), so operators recognise it.
pub fn scope(path: &Path) -> String {
    path.display().to_string()
}

/// A failed `stat`: the path is gone, or it is there but broken.
pub enum StatFailure {
    /// Nothing at the path any more: a deletion.
    Gone,
    /// Something is there that cannot be followed or read; the message says what.
    Broken(String),
}

/// Tells a deletion from a path that is there but unusable: `ENOENT` from `stat` with a symlink
/// still present (`lstat` works) is a dangling symlink, not a deletion.
pub fn classify(path: &Path, error: &io::Error) -> StatFailure {
    if error.kind() != io::ErrorKind::NotFound {
        return StatFailure::Broken(error.to_string());
    }
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => {
            let target = fs::read_link(path)
                .map(|t| t.display().to_string())
                .unwrap_or_else(|_| "?".to_owned());
            StatFailure::Broken(format!("dangling symlink to {target}: {error}"))
        }
        _ => StatFailure::Gone,
    }
}

/// Lists `roots`. `previous` is the last scan's file list: what is held when a path breaks.
pub fn list(roots: &[PathBuf], previous: &[PathBuf]) -> Listing {
    let mut listing = Listing::default();
    for root in roots {
        match fs::metadata(root) {
            Ok(meta) if meta.is_dir() => {
                let mut found = Vec::new();
                collect_dir(root, 0, previous, &mut found, &mut listing);
                listing.files.extend(found);
            }
            Ok(meta) => listing.files.push(Listed {
                path: root.clone(),
                meta: Some(meta),
            }),
            Err(e) => match classify(root, &e) {
                StatFailure::Gone => listing.problem(
                    root,
                    format!(
                        "path {} does not exist; it is served once it appears",
                        root.display()
                    ),
                ),
                StatFailure::Broken(message) => {
                    let mut found = Vec::new();
                    listing.hold(root, previous, &mut found);
                    listing.problem(
                        root,
                        format!(
                            "path {}: cannot stat: {message}; {}",
                            root.display(),
                            kept(found.len())
                        ),
                    );
                    listing.files.extend(found);
                }
            },
        }
    }
    // A file reachable through two configured paths counts once, at its first place (the
    // entries of one directory are distinct).
    if roots.len() > 1 {
        let mut seen = HashSet::new();
        listing.files.retain(|f| seen.insert(f.path.clone()));
    }
    listing
}

impl Listing {
    fn problem(&mut self, path: &Path, message: String) {
        self.problems.entry(scope(path)).or_default().push(message);
    }

    /// Keeps the files previously found at or below `path`, in their previous order.
    fn hold(&mut self, path: &Path, previous: &[PathBuf], found: &mut Vec<Listed>) {
        for file in previous.iter().filter(|f| f.starts_with(path)) {
            self.held.insert(file.clone());
            found.push(Listed {
                path: file.clone(),
                meta: None,
            });
        }
    }
}

fn kept(files: usize) -> String {
    match files {
        0 => "nothing was served from it".to_owned(),
        1 => "keeping the last good content of its 1 file".to_owned(),
        n => format!("keeping the last good content of its {n} files"),
    }
}

/// Collects the configuration files below `dir` in path order, skipping hidden entries.
///
/// Each directory's entries are sorted by name and walked depth first, which gives the same
/// order as sorting the whole list by path, at the cost of comparing names rather than whole
/// paths component by component (that sort was a fifth of an idle poll's CPU at 100 files).
fn collect_dir(
    dir: &Path,
    depth: usize,
    previous: &[PathBuf],
    found: &mut Vec<Listed>,
    listing: &mut Listing,
) {
    let read = match fs::read_dir(dir) {
        Ok(read) => read,
        Err(e) => {
            let before = found.len();
            listing.hold(dir, previous, found);
            let message = format!(
                "directory {}: cannot list: {e}; {}",
                dir.display(),
                kept(found.len() - before)
            );
            listing.problem(dir, message);
            return;
        }
    };
    let mut entries = Vec::new();
    for entry in read {
        match entry {
            Ok(entry) => entries.push(entry),
            Err(e) => {
                // The listing broke off: keep what was there rather than dropping the rest.
                let before = found.len();
                listing.hold(dir, previous, found);
                let message = format!(
                    "directory {}: listing failed: {e}; {}",
                    dir.display(),
                    kept(found.len() - before)
                );
                listing.problem(dir, message);
                return;
            }
        }
    }
    entries.sort_by_cached_key(|e| e.file_name());
    for entry in entries {
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        // Follows symlinks: ConfigMap files are symlinks into `..data`.
        match fs::metadata(&path) {
            Ok(meta) if meta.is_dir() => {
                if depth < MAX_DEPTH {
                    collect_dir(&path, depth + 1, previous, found, listing);
                }
            }
            Ok(meta) if has_config_extension(&path) => found.push(Listed {
                path,
                meta: Some(meta),
            }),
            Ok(_) => {}
            Err(e) => match classify(&path, &e) {
                // Removed while listing.
                StatFailure::Gone => {}
                StatFailure::Broken(message) => {
                    let before = found.len();
                    listing.hold(&path, previous, found);
                    let message = format!(
                        "path {}: cannot stat: {message}; {}",
                        path.display(),
                        kept(found.len() - before)
                    );
                    listing.problem(&path, message);
                }
            },
        }
    }
}

fn has_config_extension(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| EXTENSIONS.iter().any(|x| x.eq_ignore_ascii_case(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(listing: &Listing) -> Vec<PathBuf> {
        listing.files.iter().map(|f| f.path.clone()).collect()
    }

    /// Precedence is path order, component by component: `a/z.yaml` (component `a`) comes
    /// before `a-b.yaml` and `a.yaml`, although a byte-wise sort of whole paths would not agree.
    #[test]
    fn files_come_in_path_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        for f in [
            "a.yaml",
            "a-b.yaml",
            "a/z.yaml",
            "a/b/c.yaml",
            "b.json",
            "A.yml",
            "a/b.yaml",
        ] {
            let path = root.join(f);
            fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            fs::write(&path, "").expect("write");
        }
        let listing = list(&[root.to_path_buf()], &[]);
        let mut sorted = paths(&listing);
        sorted.sort();
        assert_eq!(paths(&listing), sorted);
        assert_eq!(paths(&listing).len(), 7);
        assert_eq!(paths(&listing)[1], root.join("a/b/c.yaml"));
    }

    #[test]
    fn broken_paths_hold_what_was_below_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conf = dir.path().join("conf");
        fs::create_dir_all(conf.join("sub")).expect("mkdir");
        fs::write(conf.join("a.yaml"), "").expect("write");
        fs::write(conf.join("sub/s.yaml"), "").expect("write");
        fs::write(conf.join("notes.txt"), "").expect("write");
        let roots = vec![conf.clone()];
        let first = list(&roots, &[]);
        assert_eq!(
            paths(&first),
            vec![conf.join("a.yaml"), conf.join("sub/s.yaml")]
        );
        assert!(first.held.is_empty() && first.problems.is_empty());

        // `sub` becomes a dangling symlink: held, with a problem naming it and the error.
        fs::remove_dir_all(conf.join("sub")).expect("rm");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), conf.join("sub")).expect("ln");
        let second = list(&roots, &paths(&first));
        assert_eq!(paths(&second), paths(&first));
        assert_eq!(
            second.held,
            HashSet::from([conf.join("sub/s.yaml")]),
            "{second:?}"
        );
        let problem = &second.problems[&scope(&conf.join("sub"))][0];
        assert!(problem.contains("dangling symlink"), "{problem}");
        assert!(problem.contains("No such file or directory"), "{problem}");
        assert!(problem.contains("its 1 file"), "{problem}");

        // Really removed: a deletion, no problem.
        fs::remove_file(conf.join("sub")).expect("rm link");
        let third = list(&roots, &paths(&second));
        assert_eq!(paths(&third), vec![conf.join("a.yaml")]);
        assert!(third.problems.is_empty(), "{:?}", third.problems);
    }

    #[test]
    fn a_root_below_a_regular_file_is_held() {
        let dir = tempfile::tempdir().expect("tempdir");
        let other = dir.path().join("other");
        fs::create_dir_all(&other).expect("mkdir");
        let f = other.join("f.yaml");
        fs::write(&f, "").expect("write");
        let roots = vec![f.clone()];
        let first = list(&roots, &[]);
        assert_eq!(paths(&first), vec![f.clone()]);

        fs::remove_dir_all(&other).expect("rm");
        fs::write(&other, "now a file").expect("write");
        let second = list(&roots, &paths(&first));
        assert_eq!(paths(&second), vec![f.clone()]);
        assert!(second.held.contains(&f));
        let problem = &second.problems[&scope(&f)][0];
        assert!(problem.contains("Not a directory"), "{problem}");

        // A root that never existed is not held (nothing to hold) and says so.
        let missing = dir.path().join("missing.yaml");
        let third = list(std::slice::from_ref(&missing), &[]);
        assert!(third.files.is_empty());
        assert!(third.problems[&scope(&missing)][0].contains("does not exist"));
    }
}
