//! The watcher: polls the configured paths and turns them into `Reset` and `Problems` events.
//!
//! Polling (stat every path each interval) is used instead of inotify because it behaves the same
//! on Kubernetes ConfigMap mounts (whose files change by a symlink swap), network file systems and
//! every OS, and costs one `stat` per file per interval. A file is re-read only when its
//! (mtime, size, inode) changed, or when it changed so recently that a second write within the
//! same mtime tick could have gone unnoticed (see [`RACY_WINDOW`]).
//!
//! Each scan that changed anything produces the complete set of services as one `Reset`; the core
//! diffs it against what it serves, so the watcher does not need to compute upserts/removals.
//! Files are atomic: a file with any bad document keeps serving its last good services and is
//! reported under its path in a `Problems` event until it is fixed or deleted.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use futures::stream::BoxStream;
use mcp_core::model::{Service, ServiceKey};
use mcp_core::registry::{channel_stream, EventSender, Registry, RegistryError, RegistryEvent};
use tracing::{debug, info, warn};

use crate::config::{ConfigError, FileConfig};
use crate::convert::{self, ConvertError, Format};

/// Files whose mtime is younger than this when read are read again on the next poll even if
/// their stamp did not change: file systems with coarse mtimes can hide a second same-size write.
const RACY_WINDOW: Duration = Duration::from_secs(2);

/// Symlinked directories could form loops; nobody nests configuration deeper than this.
const MAX_DEPTH: usize = 16;

/// Extensions picked up inside directories (a path named explicitly is read whatever its name).
const EXTENSIONS: [&str; 3] = ["yaml", "yml", "json"];

/// Why one file could not be used this time; reported as a problem, never fatal.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file exists but could not be read.
    #[error("file {path}: cannot read: {source}")]
    Read {
        /// The file, as configured.
        path: String,
        /// The I/O error.
        source: io::Error,
    },
    /// The file was read but one of its documents is invalid.
    #[error(transparent)]
    Convert(#[from] ConvertError),
}

/// Serves the services defined in files and directories.
#[derive(Clone, Debug)]
pub struct FileRegistry {
    config: FileConfig,
}

impl FileRegistry {
    /// Checks the configuration. Paths need not exist yet: a missing path is reported as a
    /// problem and picked up when it appears, so the adapter can start before its ConfigMap.
    pub fn new(config: FileConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self { config })
    }
}

impl Registry for FileRegistry {
    const NAME: &'static str = "file";
    /// Hosts in files are written out in full; inventory names are used as they are unless the
    /// operator sets `--host-suffix`.
    const DEFAULT_HOST_SUFFIX: &'static str = "";
    const DEFAULT_NAMESPACE: &'static str = "default";

    fn watch(&self) -> BoxStream<'static, Result<RegistryEvent, RegistryError>> {
        let paths = self.config.paths.clone();
        let interval = self.config.poll_interval;
        channel_stream(move |tx| watch_loop(tx, paths, interval))
    }
}

/// Scans, sends what changed, sleeps; forever (until the core drops the stream).
async fn watch_loop(
    tx: EventSender,
    paths: Vec<PathBuf>,
    interval: Duration,
) -> Result<(), RegistryError> {
    let mut scanner = Scanner::new(paths);
    let mut sent_services: Option<Vec<Service>> = None;
    let mut sent_problems: BTreeMap<String, Vec<String>> = BTreeMap::new();
    loop {
        // File I/O blocks; keep it off the async worker threads.
        let (returned, dirty) = tokio::task::spawn_blocking(move || {
            let dirty = scanner.scan();
            (scanner, dirty)
        })
        .await
        .map_err(|e| RegistryError::Unavailable(format!("file scan task failed: {e}")))?;
        scanner = returned;

        if dirty || sent_services.is_none() {
            let (services, problems) = scanner.snapshot();
            if sent_services.as_ref() != Some(&services) {
                debug!(services = services.len(), "Sending full set.");
                tx.send(RegistryEvent::Reset(services.clone())).await?;
                sent_services = Some(services);
            }
            let scopes: Vec<String> = sent_problems
                .keys()
                .chain(problems.keys())
                .cloned()
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            for scope in scopes {
                let now = problems.get(&scope).cloned().unwrap_or_default();
                if sent_problems.get(&scope).map_or(&[][..], Vec::as_slice) != now.as_slice() {
                    if now.is_empty() {
                        info!(scope = %scope, "Problems cleared.");
                    }
                    tx.send(RegistryEvent::Problems {
                        scope,
                        problems: now,
                    })
                    .await?;
                }
            }
            sent_problems = problems;
        }
        tokio::time::sleep(interval).await;
    }
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

/// Per-file state kept between polls.
#[derive(Debug)]
struct FileState {
    /// Stamp of the version last read; `None` if it could not be stat'ed.
    stamp: Option<Stamp>,
    /// Read again next poll even if the stamp is unchanged.
    racy: bool,
    /// Services of the last version that converted without error.
    good: Vec<Service>,
    /// Why the current version is not used, if it is not.
    error: Option<String>,
}

/// The polling state machine; synchronous so that it can be tested without a runtime and run
/// on a blocking thread.
#[derive(Debug)]
struct Scanner {
    roots: Vec<PathBuf>,
    /// Files found in the last scan, in precedence order (configured order, then sorted).
    order: Vec<PathBuf>,
    files: HashMap<PathBuf, FileState>,
    /// Problems with configured paths and directories themselves (missing, unreadable).
    path_problems: BTreeMap<String, Vec<String>>,
}

impl Scanner {
    fn new(roots: Vec<PathBuf>) -> Self {
        Self {
            roots,
            order: Vec::new(),
            files: HashMap::new(),
            path_problems: BTreeMap::new(),
        }
    }

    /// Stats every path and re-reads what changed. Returns whether anything that could change
    /// the snapshot changed.
    fn scan(&mut self) -> bool {
        let mut order = Vec::new();
        let mut path_problems: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for root in &self.roots {
            match fs::metadata(root) {
                Ok(meta) if meta.is_dir() => {
                    let mut found = Vec::new();
                    collect_dir(root, 0, &mut found, &mut path_problems);
                    found.sort();
                    order.extend(found);
                }
                Ok(_) => order.push(root.clone()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    path_problems.entry(scope(root)).or_default().push(format!(
                        "path {} does not exist; it is served once it appears",
                        root.display()
                    ));
                }
                Err(e) => {
                    path_problems
                        .entry(scope(root))
                        .or_default()
                        .push(format!("path {}: cannot stat: {e}", root.display()));
                }
            }
        }
        // A file reachable through two configured paths counts once, at its first place.
        let mut seen = HashSet::new();
        order.retain(|p| seen.insert(p.clone()));

        let mut dirty = order != self.order || path_problems != self.path_problems;
        let before = self.files.len();
        self.files.retain(|path, _| {
            let keep = seen.contains(path);
            if !keep {
                info!(file = %path.display(), "File removed; dropping its services.");
            }
            keep
        });
        dirty |= self.files.len() != before;
        for path in &order {
            dirty |= self.refresh(path);
        }
        self.order = order;
        self.path_problems = path_problems;
        dirty
    }

    /// Re-reads one file if its stamp changed. Returns whether its services or error changed.
    fn refresh(&mut self, path: &Path) -> bool {
        let stamp = match fs::metadata(path) {
            Ok(meta) => Some(Stamp::of(&meta)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // Vanished between listing and stat: gone for real on the next scan.
                return false;
            }
            Err(_) => None,
        };
        if let Some(state) = self.files.get(path) {
            if stamp.is_some() && state.stamp == stamp && !state.racy {
                return false;
            }
        }
        let read_at = SystemTime::now();
        let result = read_file(path);
        let state = self
            .files
            .entry(path.to_path_buf())
            .or_insert_with(|| FileState {
                stamp: None,
                racy: false,
                good: Vec::new(),
                error: None,
            });
        state.stamp = stamp;
        state.racy = stamp.and_then(|s| s.mtime).is_none_or(|mtime| {
            read_at
                .duration_since(mtime)
                .map_or(true, |age| age < RACY_WINDOW)
        });
        match result {
            Ok(services) => {
                if state.error.is_some() {
                    info!(file = %path.display(), services = services.len(), "File is good again.");
                }
                let changed = state.error.is_some() || state.good != services;
                if changed {
                    debug!(file = %path.display(), services = services.len(), "File read.");
                }
                state.good = services;
                state.error = None;
                changed
            }
            Err(e) => {
                let message = e.to_string();
                let changed = state.error.as_deref() != Some(message.as_str());
                if changed {
                    warn!(
                        file = %path.display(),
                        error = %e,
                        kept_services = state.good.len(),
                        "Skipping bad file; serving its last good services."
                    );
                }
                state.error = Some(message);
                changed
            }
        }
    }

    /// The services to serve (first definition of each key wins) and the problems per scope.
    fn snapshot(&self) -> (Vec<Service>, BTreeMap<String, Vec<String>>) {
        let mut problems = self.path_problems.clone();
        let mut services = Vec::new();
        let mut winners: HashMap<&ServiceKey, &str> = HashMap::new();
        for path in &self.order {
            let Some(state) = self.files.get(path) else {
                continue;
            };
            if let Some(error) = &state.error {
                problems.entry(scope(path)).or_default().push(error.clone());
            }
            for service in &state.good {
                if let Some(winner) = winners.get(&service.key) {
                    let message = format!(
                        "{}: ignored, {} is already defined by {}",
                        service.origin, service.key, winner
                    );
                    warn!(file = %path.display(), key = %service.key, first = %winner, "Duplicate service ignored.");
                    problems.entry(scope(path)).or_default().push(message);
                } else {
                    winners.insert(&service.key, &service.origin);
                    services.push(service.clone());
                }
            }
        }
        (services, problems)
    }
}

/// How a path is named in `Problems` scopes and messages: as configured (or joined below a
/// configured directory), so operators recognise it.
fn scope(path: &Path) -> String {
    path.display().to_string()
}

fn read_file(path: &Path) -> Result<Vec<Service>, FileError> {
    let name = scope(path);
    let text = fs::read_to_string(path).map_err(|source| FileError::Read {
        path: name.clone(),
        source,
    })?;
    Ok(convert::parse(&name, &text, Format::for_path(path))?)
}

/// Collects the configuration files below `dir` (unsorted), skipping hidden entries.
fn collect_dir(
    dir: &Path,
    depth: usize,
    found: &mut Vec<PathBuf>,
    problems: &mut BTreeMap<String, Vec<String>>,
) {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            problems
                .entry(scope(dir))
                .or_default()
                .push(format!("directory {}: cannot list: {e}", dir.display()));
            return;
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        // Follows symlinks: ConfigMap files are symlinks into `..data`.
        let Ok(meta) = fs::metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            if depth < MAX_DEPTH {
                collect_dir(&path, depth + 1, found, problems);
            }
        } else if path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| EXTENSIONS.iter().any(|x| x.eq_ignore_ascii_case(e)))
        {
            found.push(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use mcp_core::model::Host;

    const POLL: Duration = Duration::from_millis(50);
    const WAIT: Duration = Duration::from_secs(10);

    type Events = BoxStream<'static, Result<RegistryEvent, RegistryError>>;

    fn se(name: &str, host: &str, port: u32) -> String {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}}}\n\
             spec:\n  hosts: [{host}]\n  ports: [{{number: {port}, name: http}}]\n"
        )
    }

    fn inventory(names: &[&str]) -> String {
        let mut s = String::from("kind: Inventory\nservices:\n");
        for n in names {
            s.push_str(&format!("  - name: {n}\n    ports: {{http: 80}}\n"));
        }
        s
    }

    fn write(path: &Path, text: &str) {
        fs::write(path, text).expect("write test file");
    }

    fn watch(paths: Vec<PathBuf>) -> Events {
        FileRegistry::new(FileConfig {
            paths,
            poll_interval: POLL,
        })
        .expect("valid config")
        .watch()
    }

    /// Next event matching `want`, skipping others; panics after [`WAIT`].
    async fn next_matching(
        events: &mut Events,
        what: &str,
        want: impl Fn(&RegistryEvent) -> bool,
    ) -> RegistryEvent {
        let found = tokio::time::timeout(WAIT, async {
            while let Some(event) = events.next().await {
                let event = event.expect("no watch error");
                if want(&event) {
                    return Some(event);
                }
            }
            None
        })
        .await;
        match found {
            Ok(Some(event)) => event,
            Ok(None) => panic!("stream ended waiting for {what}"),
            Err(_) => panic!("timed out waiting for {what}"),
        }
    }

    async fn next_reset(events: &mut Events) -> Vec<Service> {
        match next_matching(events, "Reset", |e| matches!(e, RegistryEvent::Reset(_))).await {
            RegistryEvent::Reset(services) => services,
            _ => unreachable!(),
        }
    }

    async fn next_problems(events: &mut Events, for_scope: &Path) -> Vec<String> {
        let want = scope(for_scope);
        let event = next_matching(
            events,
            "Problems",
            |e| matches!(e, RegistryEvent::Problems { scope, .. } if *scope == want),
        )
        .await;
        match event {
            RegistryEvent::Problems { problems, .. } => problems,
            _ => unreachable!(),
        }
    }

    fn names(services: &[Service]) -> Vec<String> {
        services.iter().map(|s| s.key.to_string()).collect()
    }

    #[tokio::test]
    async fn initial_reset_then_edits() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a.yaml");
        let b = dir.path().join("b.yml");
        write(&a, &se("web", "web.example.com", 80));
        write(&b, &inventory(&["pay", "cart"]));
        let mut events = watch(vec![a.clone(), b.clone()]);

        // The very first event is the full set.
        let first = events
            .next()
            .await
            .expect("an event")
            .expect("not an error");
        let RegistryEvent::Reset(services) = first else {
            panic!("first event must be a Reset, got {first:?}");
        };
        assert_eq!(names(&services), vec!["web", "pay", "cart"]);
        assert_eq!(
            services[0].hosts,
            vec![Host::Absolute("web.example.com".into())]
        );
        assert!(
            services[0]
                .origin
                .ends_with("a.yaml, document 1 (ServiceEntry web)"),
            "{}",
            services[0].origin
        );

        write(&a, &se("web", "web.example.com", 8080));
        let services = next_reset(&mut events).await;
        assert_eq!(names(&services), vec!["web", "pay", "cart"]);
        assert_eq!(services[0].ports[0].number, 8080);
    }

    #[tokio::test]
    async fn bad_file_keeps_last_good_until_fixed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a.yaml");
        let b = dir.path().join("b.yaml");
        write(&a, &se("web", "web.example.com", 80));
        write(&b, &inventory(&["pay"]));
        let mut events = watch(vec![a.clone(), b.clone()]);
        assert_eq!(names(&next_reset(&mut events).await), vec!["web", "pay"]);

        // Break a: second document has a bad port number.
        write(
            &a,
            &format!(
                "{}---\n{}",
                se("web", "web.example.com", 81),
                se("api", "api.example.com", 80).replace("number: 80", "number: eighty")
            ),
        );
        let problems = next_problems(&mut events, &a).await;
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("document 2"), "{problems:?}");
        assert!(problems[0].contains("spec.ports[0].number"), "{problems:?}");

        // Another file changes: the Reset still has a's last good version (port 80, no api).
        write(&b, &inventory(&["pay", "cart"]));
        let services = next_reset(&mut events).await;
        assert_eq!(names(&services), vec!["web", "pay", "cart"]);
        assert_eq!(services[0].ports[0].number, 80);

        // Fix a: problems cleared and the new version served.
        write(&a, &se("web", "web.example.com", 8443));
        let problems = next_problems(&mut events, &a).await;
        assert!(problems.is_empty(), "{problems:?}");
    }

    #[tokio::test]
    async fn fixed_file_is_served() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a.yaml");
        write(&a, "kind: [broken\n");
        let mut events = watch(vec![a.clone()]);
        // Never parsed: nothing served, problem reported.
        assert!(next_reset(&mut events).await.is_empty());
        let problems = next_problems(&mut events, &a).await;
        assert!(problems[0].contains("YAML syntax error"), "{problems:?}");

        write(&a, &se("web", "web.example.com", 80));
        assert_eq!(names(&next_reset(&mut events).await), vec!["web"]);
        assert!(next_problems(&mut events, &a).await.is_empty());
    }

    #[tokio::test]
    async fn directory_add_and_delete() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("conf");
        fs::create_dir_all(root.join("sub")).expect("mkdir");
        fs::create_dir_all(root.join("..data")).expect("mkdir");
        write(&root.join("a.yaml"), &se("web", "web.example.com", 80));
        write(&root.join("notes.txt"), "not: config\n");
        write(
            &root.join("..data/hidden.yaml"),
            &se("hidden", "h.example.com", 80),
        );
        let mut events = watch(vec![root.clone()]);
        assert_eq!(names(&next_reset(&mut events).await), vec!["web"]);

        // A new file in a subdirectory is picked up (after a.yaml: sorted paths).
        write(
            &root.join("sub/new.json"),
            r#"{"kind": "Inventory", "namespace": "shop", "services": [{"name": "pay"}]}"#,
        );
        assert_eq!(
            names(&next_reset(&mut events).await),
            vec!["web", "shop/pay"]
        );

        // Deleting a file removes its services, without problems.
        fs::remove_file(root.join("a.yaml")).expect("rm");
        assert_eq!(names(&next_reset(&mut events).await), vec!["shop/pay"]);
    }

    #[tokio::test]
    async fn missing_path_is_a_problem_until_it_appears() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("later.yaml");
        let mut events = watch(vec![a.clone()]);
        assert!(next_reset(&mut events).await.is_empty());
        let problems = next_problems(&mut events, &a).await;
        assert!(problems[0].contains("does not exist"), "{problems:?}");

        write(&a, &se("web", "web.example.com", 80));
        assert_eq!(names(&next_reset(&mut events).await), vec!["web"]);
        assert!(next_problems(&mut events, &a).await.is_empty());
    }

    #[tokio::test]
    async fn duplicate_key_first_path_wins() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a.yaml");
        let b = dir.path().join("b.yaml");
        write(&a, &se("web", "a.example.com", 80));
        write(
            &b,
            &format!(
                "{}---\n{}",
                se("other", "o.example.com", 80),
                se("web", "b.example.com", 80)
            ),
        );
        // b is listed first: it wins for `web`.
        let mut events = watch(vec![b.clone(), a.clone()]);
        let services = next_reset(&mut events).await;
        assert_eq!(names(&services), vec!["other", "web"]);
        assert_eq!(
            services[1].hosts,
            vec![Host::Absolute("b.example.com".into())]
        );
        let problems = next_problems(&mut events, &a).await;
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains("a.yaml, document 1 (ServiceEntry web): ignored"),
            "{problems:?}"
        );
        assert!(
            problems[0].contains("b.yaml, document 2 (ServiceEntry web)"),
            "{problems:?}"
        );

        // Removing the winner lets the other definition through and clears the problem.
        fs::remove_file(&b).expect("rm");
        let services = next_reset(&mut events).await;
        assert_eq!(
            services[0].hosts,
            vec![Host::Absolute("a.example.com".into())]
        );
        assert!(next_problems(&mut events, &a).await.is_empty());
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
        write(&a, &se("web", "web.example.com", 80));
        let mut scanner = Scanner::new(vec![a.clone()]);
        assert!(scanner.scan());
        // New mtime, same content: re-read, but nothing changed.
        set_mtime(old);
        assert!(!scanner.scan());

        // Same size, same inode, mtime put back: the stamp is unchanged, so the file is not
        // re-read (the price of polling with stat only).
        write(&a, &se("web", "web.example.com", 81));
        set_mtime(old);
        assert!(!scanner.scan());
        assert_eq!(scanner.snapshot().0[0].ports[0].number, 80);

        // Any stamp change makes it re-read.
        set_mtime(old + Duration::from_secs(1));
        assert!(scanner.scan());
        assert_eq!(scanner.snapshot().0[0].ports[0].number, 81);
    }

    #[test]
    fn recently_modified_files_are_reread_once_more() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a.yaml");
        write(&a, &se("web", "web.example.com", 80));
        let mut scanner = Scanner::new(vec![a.clone()]);
        assert!(scanner.scan());
        // A same-size rewrite within the same mtime tick: caught because the file was young.
        let mtime = fs::metadata(&a).and_then(|m| m.modified()).expect("mtime");
        write(&a, &se("web", "web.example.com", 81));
        fs::File::options()
            .write(true)
            .open(&a)
            .and_then(|f| f.set_modified(mtime))
            .expect("set mtime");
        assert!(scanner.scan());
        assert_eq!(scanner.snapshot().0[0].ports[0].number, 81);
    }
}
