//! Containers for real: Debian's podman (rootful, runc) with the tests' settings
//! (`tests/containers/containers.conf`), on images built by `tests/containers/build.sh` (the
//! stand-ins for the upstream images) and `tests/containers/build-images.sh` (the project's own,
//! from `docker/Dockerfile` and `docker/Dockerfile.eureka`).
//!
//! Every container and network a test makes has a name unique to the run ([`unique`]) and is
//! removed when its guard drops, panicking or not. Tests that publish ports or make networks run
//! inside a network namespace of their own (`netns::isolate`), so nothing they start is reachable
//! from, or reaches, anything but this machine's own test namespace.
//!
//! There is no systemd here, so podman never runs a healthcheck by itself: [`healthcheck`] runs
//! one (`podman healthcheck run`), and [`HealthDriver`] does so for a set of containers every
//! second, which is what the engine's timer would do.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default()
}

/// `podman` with the tests' containers.conf.
pub fn podman() -> Command {
    let mut cmd = Command::new("podman");
    cmd.env(
        "CONTAINERS_CONF",
        repo().join("tests/containers/containers.conf"),
    )
    .stdin(Stdio::null());
    cmd
}

/// Runs podman with `args` to its end: its output, whatever the exit status.
pub fn try_podman(args: &[&str]) -> Output {
    podman().args(args).output().unwrap_or_else(|e| {
        panic!(
            "run podman {}: {e} (tests/containers/build.sh installs podman)",
            args.join(" ")
        )
    })
}

/// Runs podman with `args`; its stdout. Panics, with its stderr, unless it succeeds.
pub fn podman_ok(args: &[&str]) -> String {
    let out = try_podman(args);
    assert!(
        out.status.success(),
        "podman {} failed ({}): {}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A name unique to this run: `prefix-<pid>-<n>`.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// Panics unless the image `name` is in podman's store, naming the script that builds it.
pub fn require_image(name: &str) {
    let out = try_podman(&["image", "exists", name]);
    assert!(
        out.status.success(),
        "image {name} missing: build it with tests/containers/build.sh target and \
         tests/containers/build-images.sh (the README's test command does)"
    );
}

/// `podman image inspect NAME`: the image's one object.
pub fn inspect_image(name: &str) -> Value {
    let out = podman_ok(&["image", "inspect", name]);
    let list: Value = serde_json::from_str(&out).expect("podman image inspect JSON");
    list[0].clone()
}

/// Every path in the image's file system (`./`-less, as `tar -t` lists a `podman export`).
pub fn image_files(image: &str) -> BTreeSet<String> {
    let ctr = Container::create(image);
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("podman export {} | tar -t", shell_word(&ctr.name)))
        .env(
            "CONTAINERS_CONF",
            repo().join("tests/containers/containers.conf"),
        )
        .output()
        .expect("podman export | tar -t");
    assert!(
        out.status.success(),
        "podman export {image}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim_start_matches("./").trim_end_matches('/').to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

fn shell_word(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A container, removed (with its anonymous volumes) on drop.
pub struct Container {
    pub name: String,
}

impl Container {
    /// `podman create IMAGE` (not started): for looking at its file system.
    pub fn create(image: &str) -> Container {
        let name = unique("mcp-inspect");
        podman_ok(&["create", "--name", &name, image]);
        Container { name }
    }

    /// `podman run -d --name <unique> ARGS...` (ARGS: options, the image, its arguments).
    pub fn run(prefix: &str, args: &[&str]) -> Container {
        let name = unique(prefix);
        // Removed on drop even when `run` fails half-way (created, not started).
        let c = Container { name: name.clone() };
        let mut all = vec!["run", "-d", "--name", name.as_str()];
        all.extend_from_slice(args);
        podman_ok(&all);
        c
    }

    /// Its logs (stdout and stderr).
    pub fn logs(&self) -> String {
        let out = try_podman(&["logs", &self.name]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// `podman inspect`'s `.State`.
    pub fn state(&self) -> Value {
        let out = podman_ok(&["inspect", &self.name]);
        let v: Value = serde_json::from_str(&out).expect("podman inspect JSON");
        v[0]["State"].clone()
    }

    /// Runs the image's healthcheck once; `true` when it passed.
    pub fn healthcheck(&self) -> bool {
        healthcheck(&self.name)
    }

    /// Runs the healthcheck until it passes (panicking with the logs after `timeout`); the
    /// number of runs it took.
    pub fn wait_healthy(&self, timeout: Duration) -> usize {
        let end = Instant::now() + timeout;
        let mut runs = 0;
        loop {
            runs += 1;
            if self.healthcheck() {
                return runs;
            }
            let state = self.state();
            assert!(
                state["Running"] == true,
                "{} exited ({}) before it was healthy:\n{}",
                self.name,
                state["ExitCode"],
                self.logs()
            );
            assert!(
                Instant::now() < end,
                "{} not healthy after {timeout:?}: {}\n{}",
                self.name,
                state["Health"],
                self.logs()
            );
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// Runs `check` in it (`podman exec`) until it succeeds: for images without a HEALTHCHECK
    /// of their own (compose gives them theirs). Panics with the logs after `timeout`.
    pub fn wait_healthy_with(&self, check: &[&str], timeout: Duration) {
        let end = Instant::now() + timeout;
        while !self.exec(check).status.success() {
            assert!(
                self.state()["Running"] == true,
                "{} exited before `{}` passed:\n{}",
                self.name,
                check.join(" "),
                self.logs()
            );
            assert!(
                Instant::now() < end,
                "{}: `{}` did not pass within {timeout:?}:\n{}",
                self.name,
                check.join(" "),
                self.logs()
            );
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// Runs `args` in it (`podman exec`): its output.
    pub fn exec(&self, args: &[&str]) -> Output {
        let mut all = vec!["exec", self.name.as_str()];
        all.extend_from_slice(args);
        try_podman(&all)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- logs of {} ----\n{}", self.name, self.logs());
        }
        let _ = try_podman(&["rm", "-f", "-v", "-t", "0", &self.name]);
    }
}

/// Runs `podman healthcheck run` on the container `name`; `true` when it passed.
pub fn healthcheck(name: &str) -> bool {
    try_podman(&["healthcheck", "run", name]).status.success()
}

/// A bridge network of the test's own, removed on drop (after the containers on it). Without
/// name resolution: podman's DNS server (aardvark-dns) is one process for every network, living
/// in the network namespace where it was first started, so a network with DNS in one test's
/// namespace would break it for the compose test's; these tests address containers by IP.
pub struct Network {
    pub name: String,
}

impl Network {
    pub fn create() -> Network {
        let name = unique("mcp-net");
        podman_ok(&["network", "create", "--disable-dns", &name]);
        Network { name }
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        let _ = try_podman(&["network", "rm", "-f", &self.name]);
    }
}

/// What podman's systemd timer would do: runs the healthcheck of every running container that
/// `filter` selects, each at its own `interval` (as the engine would: running them more often
/// would spend a container's `retries` faster than Docker does), until dropped.
pub struct HealthDriver {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HealthDriver {
    /// `filter` is a podman filter (`label=com.docker.compose.project=NAME`).
    pub fn start(filter: &str) -> HealthDriver {
        let stop = Arc::new(AtomicBool::new(false));
        let filter = filter.to_string();
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            // id -> (interval, when its check is next due)
            let mut due: HashMap<String, (Duration, Instant)> = HashMap::new();
            while !s.load(Ordering::SeqCst) {
                let out =
                    try_podman(&["ps", "--filter", &filter, "--format", "{{.ID}} {{.Status}}"]);
                for line in String::from_utf8_lossy(&out.stdout).lines() {
                    // Only containers with a healthcheck show "(starting)", "(healthy)" or
                    // "(unhealthy)" in their status.
                    let Some((id, status)) = line.split_once(' ') else {
                        continue;
                    };
                    if !status.contains("(starting)") && !status.contains("healthy)") {
                        continue;
                    }
                    let now = Instant::now();
                    let entry = due
                        .entry(id.to_string())
                        .or_insert_with(|| (interval_of(id), now));
                    if now >= entry.1 {
                        entry.1 = now + entry.0;
                        healthcheck(id);
                    }
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        });
        HealthDriver {
            stop,
            thread: Some(thread),
        }
    }
}

/// The container's healthcheck interval (Docker's default, 30 s, when it has none).
fn interval_of(id: &str) -> Duration {
    let out = try_podman(&[
        "inspect",
        "--format",
        "{{.Config.Healthcheck.Interval}}",
        id,
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    // Go's time.Duration: "5s", "1m0s", or nanoseconds.
    let t = text.trim();
    let parsed = if let Ok(ns) = t.parse::<u64>() {
        Some(Duration::from_nanos(ns))
    } else {
        t.strip_suffix('s')
            .and_then(|x| x.parse::<f64>().ok())
            .map(Duration::from_secs_f64)
    };
    match parsed {
        Some(d) if !d.is_zero() => d,
        _ => Duration::from_secs(30),
    }
}

impl Drop for HealthDriver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
