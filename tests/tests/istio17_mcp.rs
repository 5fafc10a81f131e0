//! Istio 1.7's own legacy MCP sink (`istio.io/istio/pkg/mcp/sink` at Istio 1.7.8, wired as
//! Pilot 1.7 wires it: `tests/go-peers/istio17-sink`) against adapter-file over
//! `istio.mcp.v1alpha1.ResourceSource/EstablishResourceStream`: it asks for every collection
//! Pilot 1.7 reads, gets exactly the served ServiceEntries (decoded by Istio 1.7's own gogo types),
//! then an edit, a removal and an adapter restart, full state and incremental, and ACKs every
//! response.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use e2e::{peer_binary, process, service_entry_yaml as se, wait_for, Adapter};

const SERVICE_ENTRIES: &str = "istio/networking/v1alpha3/serviceentries";

/// `mcp-sink-1.7` running against an adapter, as JSON events (see its main.go).
struct Sink17 {
    child: Child,
    /// Its stderr: Istio's log, which names the error of a NACK.
    log: PathBuf,
    events: mpsc::Receiver<serde_json::Value>,
    seen: Vec<serde_json::Value>,
}

impl Sink17 {
    /// Starts it against `addr`, its log in `dir`.
    fn start(addr: SocketAddr, incremental: bool, dir: &Path) -> Sink17 {
        let bin = peer_binary(
            "ADSC_WATCH_DIR",
            "adsc",
            "mcp-sink-1.7",
            "tests/go-peers/build.sh target",
        );
        let mut cmd = Command::new(bin);
        cmd.args(["-address", &addr.to_string()]);
        if incremental {
            cmd.arg("-incremental");
        }
        let log = dir.join("mcp-sink-1.7.log");
        let stderr = File::create(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        let mut child = process::spawn_piped(&mut cmd, Stdio::from(stderr));
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                    if v.get("event").is_some() && tx.send(v).is_err() {
                        break;
                    }
                }
            }
        });
        Sink17 {
            child,
            log,
            events: rx,
            seen: Vec::new(),
        }
    }

    /// Waits for an event satisfying `pred`; panics with everything seen on timeout, and at once
    /// on a NACK that `pred` does not accept.
    fn wait(&mut self, what: &str, pred: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        let timeout = Duration::from_secs(30);
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(ev) => {
                    self.seen.push(ev.clone());
                    // Istio 1.7's ValidateServiceEntry refuses an entry it was sent.
                    assert!(
                        ev["event"] != "invalid",
                        "the adapter served a ServiceEntry Istio 1.7 refuses: {ev}"
                    );
                    if pred(&ev) {
                        return ev;
                    }
                    if ev["event"] == "nack" {
                        panic!(
                            "Istio 1.7's sink NACKed while waiting for {what}: {ev}\n{}",
                            self.history()
                        );
                    }
                }
                Err(_) => panic!(
                    "timed out after {timeout:?} waiting for {what}\n{}",
                    self.history()
                ),
            }
        }
    }

    /// The events seen and the tail of Istio's log, for a failure message.
    fn history(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        format!(
            "Istio 1.7 sink events:\n{}\nits log ({}):\n{}",
            self.seen
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n"),
            self.log.display(),
            e2e::tail(&log, 20)
        )
    }

    /// Waits for the next `apply` of the ServiceEntry collection.
    fn next_service_entries(&mut self, what: &str) -> serde_json::Value {
        self.wait(what, |e| {
            e["event"] == "apply" && e["collection"] == SERVICE_ENTRIES
        })
    }

    /// Waits until every collection the sink asked for was applied and ACKed once (what Pilot
    /// 1.7's `HasSynced` waits for), counting the events already seen; the collections.
    fn wait_synced(&mut self) -> Vec<String> {
        let start = match self.seen.iter().find(|e| e["event"] == "start") {
            Some(start) => start.clone(),
            None => self.wait("the start event", |e| e["event"] == "start"),
        };
        let asked: BTreeSet<String> = strings(&start["collections"]).into_iter().collect();
        assert!(
            asked.contains(SERVICE_ENTRIES) && asked.len() > 10,
            "Pilot 1.7 asks for its ~20 collections, ServiceEntries among them: {asked:?}"
        );
        self.assert_no_nack();
        let mut acked: BTreeSet<String> = self
            .seen
            .iter()
            .filter(|e| e["event"] == "ack")
            .map(|e| e["collection"].as_str().unwrap_or("").to_string())
            .collect();
        while acked != asked {
            let ev = self.wait("an ACK for every collection Pilot 1.7 asks for", |e| {
                e["event"] == "ack" || e["event"] == "nack"
            });
            assert_eq!(ev["event"], "ack", "the sink NACKed: {ev}");
            acked.insert(ev["collection"].as_str().unwrap_or("").to_string());
        }
        asked.into_iter().collect()
    }

    /// Asserts that the sink NACKed nothing, including events after the last one waited for.
    fn assert_no_nack(&mut self) {
        while let Ok(ev) = self.events.try_recv() {
            self.seen.push(ev);
        }
        let invalid: Vec<_> = self
            .seen
            .iter()
            .filter(|e| e["event"] == "invalid")
            .collect();
        assert!(
            invalid.is_empty(),
            "Istio 1.7 refuses served ServiceEntries: {invalid:?}"
        );
        let nacks: Vec<_> = self.seen.iter().filter(|e| e["event"] == "nack").collect();
        assert!(
            nacks.is_empty(),
            "Istio 1.7's sink NACKed: {nacks:?}\n{}",
            self.history()
        );
    }

    fn count(&self, event: &str, collection: &str) -> usize {
        self.seen
            .iter()
            .filter(|e| e["event"] == event && e["collection"] == collection)
            .count()
    }
}

impl Drop for Sink17 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|s| s.as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// `name -> object` of an apply event.
fn objects(ev: &serde_json::Value) -> BTreeMap<String, serde_json::Value> {
    ev["objects"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|o| (o["name"].as_str().unwrap_or("").to_string(), o.clone()))
                .collect()
        })
        .unwrap_or_default()
}

fn names(ev: &serde_json::Value) -> Vec<String> {
    objects(ev).into_keys().collect()
}

fn endpoint(object: &serde_json::Value) -> &serde_json::Value {
    &object["body"]["endpoints"][0]["address"]
}

fn start_adapter(dir: &Path) -> Adapter {
    let path = dir.to_string_lossy().to_string();
    let adapter = Adapter::start(
        "adapter-file",
        &["--path", &path, "--poll-interval", "50ms"],
    );
    adapter.wait_ready();
    adapter
}

/// The adapter counted `n` ACKs and no NACK on legacy MCP streams.
fn wait_adapter_acks(adapter: &Adapter, n: usize) {
    wait_for(
        Duration::from_secs(10),
        &format!("{n} legacy MCP ACKs counted by the adapter"),
        || {
            (adapter.metric_with("mcp_adapter_acks_total", "protocol=\"mcp\"") >= n as f64)
                .then_some(())
        },
    );
    assert_eq!(
        adapter.metric_with("mcp_adapter_nacks_total", "protocol=\"mcp\""),
        0.0
    );
}

#[test]
#[ignore = "needs Istio 1.7's MCP sink: tests/go-peers/build.sh target (the README's test command builds it)"]
fn istio_1_7_sink_reads_full_state_edits_and_removals() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("a.yaml"), se("a", "10.0.0.1")).expect("write");
    std::fs::write(dir.path().join("b.yaml"), se("b", "10.0.0.2")).expect("write");
    let mut adapter = start_adapter(dir.path());
    let mut sink = Sink17::start(adapter.grpc, false, dir.path());

    let first = sink.next_service_entries("the first ServiceEntries");
    assert_eq!(names(&first), ["ns/a", "ns/b"], "{first}");
    assert_eq!(first["incremental"], false, "{first}");
    let v1 = objects(&first);
    assert_eq!(v1["ns/a"]["body"]["hosts"][0], "a.example.com", "{first}");
    assert_eq!(endpoint(&v1["ns/a"]), "10.0.0.1", "{first}");
    assert_eq!(
        v1["ns/a"]["type_url"],
        "type.googleapis.com/istio.networking.v1alpha3.ServiceEntry"
    );
    let asked = sink.wait_synced();
    // Every other collection Pilot 1.7 asks for is answered, empty.
    for ev in sink.seen.iter().filter(|e| e["event"] == "apply") {
        if ev["collection"] != SERVICE_ENTRIES {
            assert_eq!(names(ev), Vec::<String>::new(), "{ev}");
        }
    }
    wait_adapter_acks(&adapter, asked.len());

    // An edit: the whole set again, only a's version changed.
    std::fs::write(dir.path().join("a.yaml"), se("a", "10.0.0.9")).expect("edit");
    let edited = sink.next_service_entries("the edit");
    assert_eq!(names(&edited), ["ns/a", "ns/b"], "{edited}");
    let v2 = objects(&edited);
    assert_eq!(endpoint(&v2["ns/a"]), "10.0.0.9", "{edited}");
    assert_ne!(v2["ns/a"]["version"], v1["ns/a"]["version"]);
    assert_eq!(v2["ns/b"]["version"], v1["ns/b"]["version"]);

    // A removal: b is no longer in the full state.
    std::fs::remove_file(dir.path().join("b.yaml")).expect("delete");
    let removed = sink.next_service_entries("the removal");
    assert_eq!(names(&removed), ["ns/a"], "{removed}");

    sink.wait("the ACK of the removal", |e| {
        e["event"] == "ack" && e["collection"] == SERVICE_ENTRIES
    });
    assert_eq!(sink.count("apply", SERVICE_ENTRIES), 3, "{:?}", sink.seen);
    assert_eq!(sink.count("ack", SERVICE_ENTRIES), 3, "{:?}", sink.seen);
    wait_adapter_acks(&adapter, asked.len() + 2);

    // The adapter restarts: Istio's client reconnects on its own and gets the same set at the
    // same version (a content hash), so Pilot would push nothing.
    adapter.restart();
    let again = sink.next_service_entries("the full state after the adapter restarted");
    assert_eq!(names(&again), ["ns/a"], "{again}");
    assert_eq!(
        objects(&again)["ns/a"]["version"],
        objects(&removed)["ns/a"]["version"]
    );
    sink.assert_no_nack();
}

#[test]
#[ignore = "needs Istio 1.7's MCP sink: tests/go-peers/build.sh target (the README's test command builds it)"]
fn istio_1_7_sink_with_incremental_mcp_gets_only_changes() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("a.yaml"), se("a", "10.0.0.1")).expect("write");
    std::fs::write(dir.path().join("b.yaml"), se("b", "10.0.0.2")).expect("write");
    let mut adapter = start_adapter(dir.path());
    // PILOT_ENABLE_INCREMENTAL_MCP=true: every collection asked for incrementally.
    let mut sink = Sink17::start(adapter.grpc, true, dir.path());

    let first = sink.next_service_entries("the first ServiceEntries");
    assert_eq!(names(&first), ["ns/a", "ns/b"], "{first}");
    let asked = sink.wait_synced();
    wait_adapter_acks(&adapter, asked.len());

    std::fs::write(dir.path().join("a.yaml"), se("a", "10.0.0.9")).expect("edit");
    let edited = sink.next_service_entries("the incremental edit");
    assert_eq!(edited["incremental"], true, "{edited}");
    assert_eq!(names(&edited), ["ns/a"], "{edited}");
    assert_eq!(endpoint(&objects(&edited)["ns/a"]), "10.0.0.9", "{edited}");
    assert_eq!(
        strings(&edited["removed"]),
        Vec::<String>::new(),
        "{edited}"
    );

    std::fs::remove_file(dir.path().join("b.yaml")).expect("delete");
    let removed = sink.next_service_entries("the incremental removal");
    assert_eq!(removed["incremental"], true, "{removed}");
    assert_eq!(names(&removed), Vec::<String>::new(), "{removed}");
    assert_eq!(strings(&removed["removed"]), ["ns/b"], "{removed}");

    sink.wait("the ACK of the removal", |e| {
        e["event"] == "ack" && e["collection"] == SERVICE_ENTRIES
    });
    assert_eq!(sink.count("ack", SERVICE_ENTRIES), 3, "{:?}", sink.seen);
    wait_adapter_acks(&adapter, asked.len() + 2);

    // While the adapter is down a service is added. Istio's client reconnects with the versions
    // it holds (initial_resource_versions) and gets only what it lacks: c, not a again.
    adapter.kill();
    std::fs::write(dir.path().join("c.yaml"), se("c", "10.0.0.3")).expect("write");
    adapter.restart();
    let resumed = sink.next_service_entries("the changes after the adapter restarted");
    assert_eq!(resumed["incremental"], true, "{resumed}");
    assert_eq!(names(&resumed), ["ns/c"], "{resumed}");
    assert_eq!(
        strings(&resumed["removed"]),
        Vec::<String>::new(),
        "{resumed}"
    );
    sink.assert_no_nack();
}
