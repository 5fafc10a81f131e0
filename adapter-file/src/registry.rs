//! The watcher: runs the [`Scanner`] every poll interval and turns what it finds into events.
//!
//! Polling (stat every path each interval) is used instead of inotify because it behaves the same
//! on Kubernetes ConfigMap mounts (whose files change by a symlink swap), network file systems and
//! every OS, and costs one `stat` per file per interval.
//!
//! The first scan sends the complete set as one `Reset`; later scans send `Upsert`s and `Remove`s
//! for what the changed files changed (a `Reset` again only if the set had to be derived from
//! scratch), so an edit of one file costs the core that file's services, not the whole set.
//! Files are atomic: a file with any bad document keeps serving its last good services and is
//! reported under its path in a `Problems` event until it is fixed or deleted.

use futures::stream::BoxStream;
use mcp_core::problems::ProblemLedger;
use mcp_core::registry::{channel_stream, EventSender, Registry, RegistryError, RegistryEvent};
use mcp_core::vip::VipCidr;
use tracing::{debug, info, warn};

use crate::config::{ConfigError, FileConfig};
use crate::scanner::{Changes, Limits, Scanner};

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

/// Scans, sends what changed, sleeps; forever (until the core drops the stream).
async fn watch_loop(tx: EventSender, config: FileConfig) -> Result<(), RegistryError> {
    let limits = Limits {
        read_timeout: config.read_timeout,
        max_file_size: config.max_file_size,
        settle: config.settle_time,
    };
    // Reads time out on their own; this only catches a scan blocked in stat or readdir.
    let scan_patience = config.read_timeout.saturating_mul(2);
    // The scanner's per-file services are the adapter's one copy of the registry (the core keeps
    // only encoded resources); what was sent is what the scanner held after the last scan.
    let mut scanner = Scanner::new(config.paths, limits);
    let mut sent_problems = ProblemLedger::new();
    loop {
        // File I/O blocks; keep it off the async worker threads.
        let mut task = tokio::task::spawn_blocking(move || {
            let scan = scanner.scan();
            (scanner, scan)
        });
        let mut blocked = false;
        let (returned, scan) = loop {
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

        match scan.changes {
            Changes::None => {}
            Changes::All => {
                let services = scanner.served();
                debug!(services = services.len(), "Sending full set.");
                tx.send(RegistryEvent::Reset(services)).await?;
            }
            Changes::Some { upserts, removes } => {
                debug!(
                    upserts = upserts.len(),
                    removes = removes.len(),
                    "Sending changes."
                );
                // One event: a file's edit is served whole or not yet, never half.
                tx.send(RegistryEvent::Changes { upserts, removes }).await?;
            }
        }
        // A blocked scan reported a problem of its own, which this replaces.
        if scan.problems || blocked {
            for event in sent_problems.replace_all(scanner.problems()) {
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
    use mcp_core::model::{Host, Service};

    const POLL: Duration = Duration::from_millis(50);
    const WAIT: Duration = Duration::from_secs(10);
    /// Long enough for several polls: nothing arriving in it means nothing was sent.
    const QUIET: Duration = Duration::from_millis(400);

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

    /// One service as the tests compare it: key, first host, first port.
    fn brief(s: &Service) -> String {
        let host = match s.hosts.first() {
            Some(Host::Absolute(h) | Host::Relative(h)) => h.as_str(),
            None => "-",
        };
        let port = s.ports.first().map_or(0, |p| p.number);
        format!("{} {host}:{port}", s.key)
    }

    /// An event as the tests compare it; problems are named by file name and counted.
    fn describe(event: &RegistryEvent) -> String {
        match event {
            RegistryEvent::Reset(services) => {
                let all: Vec<String> = services.iter().map(brief).collect();
                format!("Reset [{}]", all.join(", "))
            }
            RegistryEvent::Upsert(s) => format!("Upsert {}", brief(s)),
            RegistryEvent::Remove(key) => format!("Remove {key}"),
            // One event; its parts in order.
            RegistryEvent::Changes { upserts, removes } => upserts
                .iter()
                .map(|s| format!("Upsert {}", brief(s)))
                .chain(removes.iter().map(|k| format!("Remove {k}")))
                .collect::<Vec<_>>()
                .join("; "),
            RegistryEvent::Problems { scope, problems } => {
                let file = Path::new(scope)
                    .file_name()
                    .map_or_else(|| scope.clone(), |f| f.to_string_lossy().into_owned());
                format!("Problems {file} {}", problems.len())
            }
            RegistryEvent::Retrying(e) => format!("Retrying {e}"),
            RegistryEvent::Recovered => "Recovered".into(),
        }
    }

    async fn next_event(events: &mut Events) -> RegistryEvent {
        match tokio::time::timeout(WAIT, events.next()).await {
            Ok(Some(Ok(event))) => event,
            Ok(Some(Err(e))) => panic!("watch error: {e}"),
            Ok(None) => panic!("stream ended"),
            Err(_) => panic!("timed out waiting for an event"),
        }
    }

    /// The next `want.len()` events are exactly `want`, and nothing follows them.
    async fn expect(events: &mut Events, want: &[&str]) -> Vec<RegistryEvent> {
        let mut got = Vec::new();
        for _ in want {
            got.push(next_event(events).await);
        }
        let described: Vec<String> = got.iter().map(describe).collect();
        assert_eq!(described, want);
        quiet(events).await;
        got
    }

    /// The end of a test, whose last check was that nothing more is sent: writing `content` to
    /// `path` sends exactly `want` next (an event that came after the quiet window would come
    /// first).
    async fn then_only(events: &mut Events, path: &Path, content: &str, want: &[&str]) {
        write(path, content);
        let mut got = Vec::new();
        for _ in want {
            got.push(describe(&next_event(events).await));
        }
        assert_eq!(got, want, "the next events after the quiet window");
    }

    /// Nothing is sent for several polls.
    async fn quiet(events: &mut Events) {
        if let Ok(Some(event)) = tokio::time::timeout(QUIET, events.next()).await {
            panic!("unexpected event: {event:?}");
        }
    }

    fn problems_of(event: &RegistryEvent) -> &[String] {
        match event {
            RegistryEvent::Problems { problems, .. } => problems,
            other => panic!("not a Problems event: {other:?}"),
        }
    }

    #[tokio::test]
    async fn first_reset_then_only_what_changed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a.yaml");
        let b = dir.path().join("b.yml");
        write(&a, &se("web", "web.example.com", 80));
        write(&b, &inventory(&["pay", "cart"]));
        let mut events = watch(vec![a.clone(), b.clone()]);

        // The very first event is the full set.
        let first = expect(
            &mut events,
            &["Reset [web web.example.com:80, pay pay:80, cart cart:80]"],
        )
        .await;
        let RegistryEvent::Reset(services) = &first[0] else {
            unreachable!()
        };
        assert!(
            services[0]
                .origin
                .ends_with("a.yaml, document 1 (ServiceEntry web)"),
            "{}",
            services[0].origin
        );

        // An edit sends the changed service only.
        write(&a, &se("web", "web.example.com", 8080));
        expect(&mut events, &["Upsert web web.example.com:8080"]).await;

        // One service added and one changed in a file of several: those two, in file order.
        write(
            &b,
            "kind: Inventory\nservices:\n  - name: pay\n    ports: {http: 80}\n  - name: cart\n    \
             ports: {http: 81}\n  - name: shop\n    ports: {http: 80}\n",
        );
        expect(&mut events, &["Upsert cart cart:81; Upsert shop shop:80"]).await;

        // A service taken out of a file is removed (after the settle time); a deleted file's
        // services at once.
        write(&b, &inventory(&["pay", "cart"]));
        expect(&mut events, &["Upsert cart cart:80; Remove shop"]).await;
        fs::remove_file(&b).expect("rm");
        let gone = expect(
            &mut events,
            &["Remove pay; Remove cart", "Problems b.yml 1"],
        )
        .await;
        assert!(problems_of(&gone[1])[0].contains("does not exist"));

        // The same content written again (new mtime): nothing is sent.
        write(&a, &se("web", "web.example.com", 8080));
        quiet(&mut events).await;
        then_only(
            &mut events,
            &a,
            &se("web", "web.example.com", 8081),
            &["Upsert web web.example.com:8081"],
        )
        .await;
    }

    #[tokio::test]
    async fn bad_file_keeps_last_good_until_fixed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a.yaml");
        let b = dir.path().join("b.yaml");
        write(&a, &se("web", "web.example.com", 80));
        write(&b, &inventory(&["pay"]));
        let mut events = watch(vec![a.clone(), b.clone()]);
        expect(&mut events, &["Reset [web web.example.com:80, pay pay:80]"]).await;

        // Break a: second document has a bad port number. Its services stay as they were.
        write(
            &a,
            &format!(
                "{}---\n{}",
                se("web", "web.example.com", 81),
                se("api", "api.example.com", 80).replace("number: 80", "number: eighty")
            ),
        );
        let got = expect(&mut events, &["Problems a.yaml 1"]).await;
        let problems = problems_of(&got[0]);
        assert!(problems[0].contains("document 2"), "{problems:?}");
        assert!(problems[0].contains("spec.ports[0].number"), "{problems:?}");

        // Another file changes: only its change is sent; a's last good version stays served.
        write(&b, &inventory(&["pay", "cart"]));
        expect(&mut events, &["Upsert cart cart:80"]).await;

        // Fix a: the new version is served and the problem cleared.
        write(&a, &se("web", "web.example.com", 8443));
        let got = expect(
            &mut events,
            &["Upsert web web.example.com:8443", "Problems a.yaml 0"],
        )
        .await;
        assert!(problems_of(&got[1]).is_empty());
        then_only(
            &mut events,
            &a,
            &se("web", "web.example.com", 8444),
            &["Upsert web web.example.com:8444"],
        )
        .await;
    }

    #[tokio::test]
    async fn fixed_file_is_served() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a.yaml");
        write(&a, "kind: [broken\n");
        let mut events = watch(vec![a.clone()]);
        // Never parsed: nothing served, problem reported.
        let got = expect(&mut events, &["Reset []", "Problems a.yaml 1"]).await;
        assert!(problems_of(&got[1])[0].contains("YAML syntax error"));

        write(&a, &se("web", "web.example.com", 80));
        expect(
            &mut events,
            &["Upsert web web.example.com:80", "Problems a.yaml 0"],
        )
        .await;
        then_only(
            &mut events,
            &a,
            &se("web", "web.example.com", 81),
            &["Upsert web web.example.com:81"],
        )
        .await;
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
        expect(&mut events, &["Reset [web web.example.com:80]"]).await;

        // A new file in a subdirectory is picked up.
        write(
            &root.join("sub/new.json"),
            r#"{"kind": "Inventory", "namespace": "shop", "services": [{"name": "pay"}]}"#,
        );
        expect(&mut events, &["Upsert shop/pay pay:0"]).await;

        // Deleting a file removes its services, without problems.
        fs::remove_file(root.join("a.yaml")).expect("rm");
        expect(&mut events, &["Remove web"]).await;
        then_only(
            &mut events,
            &root.join("a.yaml"),
            &se("web", "web.example.com", 81),
            &["Upsert web web.example.com:81"],
        )
        .await;
    }

    #[tokio::test]
    async fn missing_path_is_a_problem_until_it_appears() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("later.yaml");
        let mut events = watch(vec![a.clone()]);
        let got = expect(&mut events, &["Reset []", "Problems later.yaml 1"]).await;
        assert!(problems_of(&got[1])[0].contains("does not exist"));

        write(&a, &se("web", "web.example.com", 80));
        expect(
            &mut events,
            &["Upsert web web.example.com:80", "Problems later.yaml 0"],
        )
        .await;
        then_only(
            &mut events,
            &a,
            &se("web", "web.example.com", 81),
            &["Upsert web web.example.com:81"],
        )
        .await;
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
        let got = expect(
            &mut events,
            &[
                "Reset [other o.example.com:80, web b.example.com:80]",
                "Problems a.yaml 1",
            ],
        )
        .await;
        let problems = problems_of(&got[1]);
        assert!(
            problems[0].contains("a.yaml, document 1 (ServiceEntry web): ignored"),
            "{problems:?}"
        );
        assert!(
            problems[0].contains("b.yaml, document 2 (ServiceEntry web)"),
            "{problems:?}"
        );

        // Editing the shadowed definition changes nothing that is served or reported.
        write(&a, &se("web", "a2.example.com", 80));
        quiet(&mut events).await;

        // The winner's definition changes: served, and the problem names its new origin.
        write(
            &b,
            &format!(
                "{}---\n{}---\n{}",
                se("other", "o.example.com", 80),
                se("more", "m.example.com", 80),
                se("web", "b.example.com", 81)
            ),
        );
        let got = expect(
            &mut events,
            &[
                "Upsert more m.example.com:80; Upsert web b.example.com:81",
                "Problems a.yaml 1",
            ],
        )
        .await;
        assert!(problems_of(&got[1])[0].contains("b.yaml, document 3"));

        // Removing the winner lets the other definition through and clears the problem.
        fs::remove_file(&b).expect("rm");
        let got = expect(
            &mut events,
            &[
                "Upsert web a2.example.com:80; Remove other; Remove more",
                "Problems a.yaml 0",
                "Problems b.yaml 1",
            ],
        )
        .await;
        assert!(problems_of(&got[2])[0].contains("does not exist"));

        // It comes back: it wins again, and the other definition is shadowed again.
        write(&b, &se("web", "b.example.com", 82));
        expect(
            &mut events,
            &[
                "Upsert web b.example.com:82",
                "Problems b.yaml 0",
                "Problems a.yaml 1",
            ],
        )
        .await;
        then_only(
            &mut events,
            &b,
            &se("web", "b.example.com", 83),
            &["Upsert web b.example.com:83"],
        )
        .await;
    }

    #[tokio::test]
    async fn duplicate_key_within_one_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a.yaml");
        write(
            &a,
            &format!(
                "{}---\n{}",
                se("web", "one.example.com", 80),
                se("web", "two.example.com", 80)
            ),
        );
        let mut events = watch(vec![a.clone()]);
        expect(
            &mut events,
            &["Reset [web one.example.com:80]", "Problems a.yaml 1"],
        )
        .await;

        // The first definition goes: the second is served.
        write(&a, &se("web", "two.example.com", 80));
        expect(
            &mut events,
            &["Upsert web two.example.com:80", "Problems a.yaml 0"],
        )
        .await;
        then_only(
            &mut events,
            &a,
            &se("web", "two.example.com", 81),
            &["Upsert web two.example.com:81"],
        )
        .await;
    }
}
