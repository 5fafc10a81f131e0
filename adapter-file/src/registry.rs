//! The watcher: runs the [`Scanner`] every poll interval and turns what it finds into `Reset`
//! and `Problems` events.
//!
//! Polling (stat every path each interval) is used instead of inotify because it behaves the same
//! on Kubernetes ConfigMap mounts (whose files change by a symlink swap), network file systems and
//! every OS, and costs one `stat` per file per interval.
//!
//! Each scan that changed anything produces the complete set of services as one `Reset`; the core
//! diffs it against what it serves, so the watcher does not need to compute upserts/removals.
//! Files are atomic: a file with any bad document keeps serving its last good services and is
//! reported under its path in a `Problems` event until it is fixed or deleted.

use futures::stream::BoxStream;
use mcp_core::model::Service;
use mcp_core::problems::ProblemLedger;
use mcp_core::registry::{channel_stream, EventSender, Registry, RegistryError, RegistryEvent};
use mcp_core::vip::VipCidr;
use tracing::{debug, info, warn};

use crate::config::{ConfigError, FileConfig};
use crate::scanner::{Limits, Scanner};

/// Scope of the problem reported while a whole scan is blocked (in `stat` or a directory
/// listing, which cannot be given a timeout the way file reads are).
const SCAN_SCOPE: &str = "scan";

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
    const DEFAULT_VIP_CIDR: VipCidr = VipCidr::range(242, 1, 0, 0, 16);

    fn watch(&self) -> BoxStream<'static, Result<RegistryEvent, RegistryError>> {
        let config = self.config.clone();
        channel_stream(move |tx| watch_loop(tx, config))
    }
}

/// Identifies a full set: equal sets (content and origins, in order) have equal fingerprints.
fn fingerprint(services: &[Service]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for s in services {
        h.update(&s.content_hash().to_le_bytes());
        h.update(s.origin.as_bytes());
        h.update(&[0]);
    }
    h.digest()
}

/// Scans, sends what changed, sleeps; forever (until the core drops the stream).
async fn watch_loop(tx: EventSender, config: FileConfig) -> Result<(), RegistryError> {
    let limits = Limits {
        read_timeout: config.read_timeout,
        max_file_size: config.max_file_size,
        settle: config.settle_time,
    };
    // Reads time out on their own; this only catches a scan blocked in stat or readdir.
    let scan_patience = config.read_timeout.saturating_mul(2);
    let mut scanner = Scanner::new(config.paths, limits);
    // A fingerprint of the set last sent, not a copy: the scanner's per-file services are the
    // adapter's one copy of the registry (the core keeps only encoded resources).
    let mut sent_services: Option<u64> = None;
    let mut sent_problems = ProblemLedger::new();
    loop {
        // File I/O blocks; keep it off the async worker threads.
        let mut task = tokio::task::spawn_blocking(move || {
            let dirty = scanner.scan();
            (scanner, dirty)
        });
        let mut blocked = false;
        let (returned, dirty) = loop {
            match tokio::time::timeout(scan_patience, &mut task).await {
                Ok(joined) => {
                    break joined.map_err(|e| {
                        RegistryError::Unavailable(format!("file scan task failed: {e}"))
                    })?
                }
                Err(_) if !blocked => {
                    blocked = true;
                    warn!(
                        waited_ms = scan_patience.as_millis(),
                        "File scan is blocked in stat or a directory listing; serving the last good content."
                    );
                    let problem = format!(
                        "the scan of the configured paths has not finished after {}s: stat or a \
                         directory listing is blocked; serving the last good content",
                        scan_patience.as_secs_f64()
                    );
                    if let Some(event) = sent_problems.update(SCAN_SCOPE, vec![problem]) {
                        tx.send(event).await?;
                    }
                }
                Err(_) => {}
            }
        };
        scanner = returned;

        if dirty || blocked || sent_services.is_none() {
            let (services, problems) = scanner.snapshot();
            let print = fingerprint(&services);
            if sent_services != Some(print) {
                debug!(services = services.len(), "Sending full set.");
                tx.send(RegistryEvent::Reset(services)).await?;
                sent_services = Some(print);
            }
            for event in sent_problems.replace_all(problems) {
                if let RegistryEvent::Problems { scope, problems } = &event {
                    if problems.is_empty() {
                        info!(scope = %scope, "Problems cleared.");
                    }
                }
                tx.send(event).await?;
            }
        }
        tokio::time::sleep(config.poll_interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    use futures::StreamExt;
    use mcp_core::model::Host;

    use crate::walk::scope;

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
            poll_interval: POLL,
            settle_time: Duration::from_millis(200),
            ..FileConfig::new(paths)
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
}
