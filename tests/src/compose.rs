//! `docker compose` for real: Docker Compose v2 (github.com/docker/compose/v2, built from the Go
//! module proxy by `tests/containers/build.sh` into `target/compose/docker-compose`) against
//! podman's Docker API (`podman system service`, started here on a socket of the test's own).
//!
//! The project name is unique to the run (`COMPOSE_PROJECT_NAME`, which wins over the file's
//! `name:`), so its containers, network and volumes are the run's own. On drop: when the test
//! failed, `compose ps -a` and the logs of every container that is not healthy or exited 0; then
//! `compose down -v`, and the API service is stopped. The test runs inside a network namespace of
//! its own (`netns::isolate`): published ports answer on that namespace's 127.0.0.1 only.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::podman::{podman, podman_ok, repo, try_podman, unique, HealthDriver};

/// The compose binary: `$COMPOSE_BIN`, else `target/compose/docker-compose`.
pub fn compose_bin() -> PathBuf {
    crate::peer_file(
        "COMPOSE_BIN",
        "compose/docker-compose",
        "tests/containers/build.sh target",
    )
}

/// One compose project, brought down on drop.
pub struct Compose {
    pub project: String,
    file: PathBuf,
    dir: tempfile::TempDir,
    service: Option<Child>,
    env: Vec<(String, String)>,
    health: Option<HealthDriver>,
}

impl Compose {
    /// Starts podman's Docker API on a socket in a temporary directory and waits until it
    /// answers; nothing of the project runs yet. `env`: variables the compose file reads.
    pub fn new(file: &Path, env: &[(&str, &str)]) -> Compose {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("podman.sock");
        let log = std::fs::File::create(dir.path().join("podman-service.log")).expect("log");
        let service = podman()
            .args(["system", "service", "--time=0"])
            .arg(format!("unix://{}", socket.display()))
            .stdout(Stdio::from(log.try_clone().expect("log")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("podman system service");
        // `docker compose` as users type it: a `docker` on PATH whose `compose` is the plugin.
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).expect("bin dir");
        let wrapper = format!(
            "#!/bin/sh\n# docker compose ARGS -> the Compose v2 binary (no Docker CLI needed)\n\
             [ \"$1\" = compose ] || {{ echo \"only 'docker compose' here\" >&2; exit 2; }}\n\
             shift\nexec '{}' \"$@\"\n",
            compose_bin().display()
        );
        let docker = bin.join("docker");
        std::fs::write(&docker, wrapper).expect("write docker wrapper");
        set_executable(&docker);
        let project = unique("mcpdemo");
        let mut env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        env.push(("DOCKER_HOST".into(), format!("unix://{}", socket.display())));
        env.push(("COMPOSE_PROJECT_NAME".into(), project.clone()));
        env.push((
            "CONTAINERS_CONF".into(),
            repo()
                .join("tests/containers/containers.conf")
                .display()
                .to_string(),
        ));
        let path = std::env::var("PATH").unwrap_or_default();
        env.push(("PATH".into(), format!("{}:{path}", bin.display())));
        let c = Compose {
            project,
            file: file.to_path_buf(),
            dir,
            service: Some(service),
            env,
            health: None,
        };
        let end = Instant::now() + Duration::from_secs(30);
        while !socket.exists() || !c.docker(&["compose", "version"]).status.success() {
            assert!(
                Instant::now() < end,
                "podman's Docker API did not come up: {}",
                std::fs::read_to_string(c.dir.path().join("podman-service.log"))
                    .unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        c
    }

    /// A shell command run as a user of the walkthrough would (in the repository root, with
    /// `docker compose` on PATH and this project's environment): its output.
    pub fn sh(&self, script: &str) -> Output {
        self.command("sh")
            .args(["-c", script])
            .output()
            .unwrap_or_else(|e| panic!("sh -c {script}: {e}"))
    }

    /// `docker ARGS` (only `docker compose ...`) with this project's environment.
    pub fn docker(&self, args: &[&str]) -> Output {
        self.command("docker")
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("docker {}: {e}", args.join(" ")))
    }

    /// `docker compose -f FILE ARGS`; panics with its output unless it succeeds. Its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let mut all = vec!["compose", "-f"];
        let file = self.file.display().to_string();
        all.push(&file);
        all.extend_from_slice(args);
        let out = self.docker(&all);
        assert!(
            out.status.success(),
            "docker {} failed ({}):\n{}{}",
            all.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(if program == "docker" {
            self.dir.path().join("bin/docker")
        } else {
            PathBuf::from(program)
        });
        cmd.current_dir(repo()).stdin(Stdio::null());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// `docker compose up -d` with podman's healthchecks run once a second meanwhile (there is
    /// no systemd to time them); they keep running until the project is brought down.
    pub fn up(&mut self, timeout: Duration) {
        self.health = Some(HealthDriver::start(&format!(
            "label=com.docker.compose.project={}",
            self.project
        )));
        let mut all = vec!["compose".to_string(), "-f".into()];
        all.push(self.file.display().to_string());
        all.extend(["up".into(), "-d".into()]);
        let mut child = self
            .command("docker")
            .args(&all)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("docker compose up");
        let end = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().expect("wait compose up") {
                let out = child.wait_with_output().expect("compose up output");
                assert!(
                    status.success(),
                    "docker compose up -d failed ({status}):\n{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                return;
            }
            if Instant::now() > end {
                let _ = child.kill();
                let out = child.wait_with_output().expect("compose up output");
                panic!(
                    "docker compose up -d did not finish within {timeout:?}:\n{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// `docker compose ps -a --format json`: one object per container.
    pub fn ps(&self) -> Vec<Value> {
        let out = self.ok(&["ps", "-a", "--format", "json"]);
        parse_ps(&out).unwrap_or_else(|| panic!("docker compose ps: not JSON:\n{out}"))
    }

    /// Containers, networks and volumes of the project that podman has, by compose's project
    /// label. A listing podman fails is a panic, not an empty list: "down -v leaves nothing"
    /// must not pass on a listing that did not run (callers list before `down` too, a
    /// positive control for the filter).
    pub fn leftovers(&self) -> Vec<String> {
        let label = format!("label=com.docker.compose.project={}", self.project);
        let mut left = Vec::new();
        for (what, args) in [
            (
                "container",
                vec!["ps", "-a", "--filter", &label, "--format", "{{.Names}}"],
            ),
            (
                "network",
                vec!["network", "ls", "--filter", &label, "--format", "{{.Name}}"],
            ),
            (
                "volume",
                vec!["volume", "ls", "--filter", &label, "--format", "{{.Name}}"],
            ),
        ] {
            for l in podman_ok(&args).lines() {
                if !l.trim().is_empty() {
                    left.push(format!("{what} {l}"));
                }
            }
        }
        left
    }

    /// `docker compose down -v`; the healthchecks stop first.
    pub fn down(&mut self) {
        self.health = None;
        self.ok(&["down", "-v", "-t", "2"]);
    }

    fn dump_failing(&self) {
        let file = self.file.display().to_string();
        let ps = |extra: &[&str]| {
            let mut args = vec!["compose", "-f", file.as_str(), "ps", "-a"];
            args.extend_from_slice(extra);
            self.docker(&args)
        };
        let out = ps(&[]);
        eprintln!(
            "---- docker compose ps -a ----\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let out = ps(&["--format", "json"]);
        let ps = parse_ps(&String::from_utf8_lossy(&out.stdout)).unwrap_or_default();
        for c in ps {
            let state = c["State"].as_str().unwrap_or("");
            let health = c["Health"].as_str().unwrap_or("");
            let exit = c["ExitCode"].as_i64().unwrap_or(0);
            let fine = (state == "running" && (health.is_empty() || health == "healthy"))
                || (state == "exited" && exit == 0);
            if !fine {
                let name = c["Name"].as_str().unwrap_or("");
                let logs = try_podman(&["logs", "--tail", "200", name]);
                eprintln!(
                    "---- logs of {name} ({state} {health} exit {exit}) ----\n{}{}",
                    String::from_utf8_lossy(&logs.stdout),
                    String::from_utf8_lossy(&logs.stderr)
                );
            }
        }
    }
}

impl Drop for Compose {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump_failing();
        }
        self.health = None;
        let file = self.file.display().to_string();
        let _ = self.docker(&["compose", "-f", &file, "down", "-v", "-t", "0"]);
        // Whatever compose left (a failed `up` can leave created containers behind).
        let label = format!("label=com.docker.compose.project={}", self.project);
        let ids = try_podman(&["ps", "-aq", "--filter", &label]);
        for id in String::from_utf8_lossy(&ids.stdout).split_whitespace() {
            let _ = try_podman(&["rm", "-f", "-v", "-t", "0", id]);
        }
        let _ = try_podman(&["network", "prune", "-f", "--filter", &label]);
        let _ = try_podman(&["volume", "prune", "-f", "--filter", &label]);
        if let Some(mut s) = self.service.take() {
            let _ = s.kill();
            let _ = s.wait();
        }
    }
}

/// `compose ps --format json`: one JSON object per line (Compose v2.21+), or one array.
fn parse_ps(out: &str) -> Option<Vec<Value>> {
    if out.trim_start().starts_with('[') {
        serde_json::from_str::<Vec<Value>>(out).ok()
    } else {
        out.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

fn set_executable(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mut p = std::fs::metadata(path).expect("stat").permissions();
    p.set_mode(0o755);
    std::fs::set_permissions(path, p).expect("chmod");
}
