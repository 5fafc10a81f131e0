//! An adapter's real binary as a test peer: started on free ports, probed on its admin port,
//! restarted with the same ports, and asked for its metrics and steady state.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{free_addr, http_get, metric_sum, wait_for, workspace_bin, Process};

/// A running adapter process, killed on drop.
pub struct Adapter {
    process: Process,
    /// gRPC address.
    pub grpc: SocketAddr,
    /// Admin address.
    pub admin: SocketAddr,
    binary: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    _dir: tempfile::TempDir,
}

impl Adapter {
    /// Starts `binary` with `args` plus `--listen`/`--admin-listen` on free ports; waits until
    /// the admin port answers.
    pub fn start(binary: &str, args: &[&str]) -> Adapter {
        Self::start_with_env(binary, args, &[])
    }

    /// [`Adapter::start`] with extra environment variables.
    pub fn start_with_env(binary: &str, args: &[&str], env: &[(&str, &str)]) -> Adapter {
        Self::start_on(binary, free_addr(), args, env)
    }

    /// [`Adapter::start_with_env`] with the gRPC port `grpc` (`--shards n` needs the `n - 1`
    /// ports after it free too: [`crate::free_addrs`]).
    pub fn start_on(
        binary: &str,
        grpc: SocketAddr,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Adapter {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = Adapter {
            process: Process::new(binary, dir.path(), Duration::from_millis(50)),
            grpc,
            admin: free_addr(),
            binary: binary.to_string(),
            args: args.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            _dir: dir,
        };
        a.spawn();
        a
    }

    fn spawn(&self) {
        let mut cmd = Command::new(workspace_bin(&self.binary));
        cmd.args(&self.args)
            .arg("--listen")
            .arg(self.grpc.to_string())
            .arg("--admin-listen")
            .arg(self.admin.to_string())
            .env("RUST_LOG", "info")
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        self.process.spawn_with_stdout(&mut cmd, Stdio::null());
        self.process.wait_until(
            Duration::from_secs(20),
            "its admin port open (/healthz 200)",
            || self.admin_status("/healthz") == Some(200),
        );
    }

    /// Kills the process (SIGKILL: no goodbye to its sinks, as when a node dies).
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Starts it again with the same arguments and ports (killing it first if it runs), and
    /// waits until the admin port answers.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// [`Adapter::restart`] with other arguments (the same ports).
    pub fn restart_with(&mut self, args: &[&str]) {
        self.args = args.iter().map(|s| s.to_string()).collect();
        self.restart();
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// `xds://` and the gRPC address: what sinks (mcpctl, istiod) connect to.
    pub fn xds_url(&self) -> String {
        format!("xds://{}", self.grpc)
    }

    /// Waits until /readyz is 200.
    pub fn wait_ready(&self) {
        self.wait_admin(
            Duration::from_secs(20),
            "adapter /readyz",
            "/readyz",
            |s, _| s == 200,
        );
    }

    /// The status of a GET on the admin port, `None` when it cannot be reached.
    fn admin_status(&self, path: &str) -> Option<u16> {
        http_get(self.admin, path).ok().map(|(s, _)| s)
    }

    /// Polls `path` on the admin port until `pred(status, body)` holds, within `timeout`; the
    /// body.
    pub fn wait_admin(
        &self,
        timeout: Duration,
        what: &str,
        path: &str,
        pred: impl Fn(u16, &str) -> bool,
    ) -> String {
        wait_for(timeout, what, || {
            http_get(self.admin, path)
                .ok()
                .filter(|(s, b)| pred(*s, b))
                .map(|(_, b)| b)
        })
    }

    /// Polls /registryz until it answers `status`, within `timeout`; the body. A 503 whose
    /// registry line only says the first sync has not happened yet (`<registry> not synced yet`,
    /// no error) is what every adapter answers at its start, before it has tried anything: it is
    /// passed over, so that waiting for a failure on a newly started adapter returns the
    /// failure's report. The registry line is the first; the Kubernetes output's line, when
    /// there is one, follows it (and may say nothing wrong yet either).
    pub fn wait_registryz(&self, timeout: Duration, what: &str, status: u16) -> String {
        self.wait_admin(timeout, what, "/registryz", |s, body| {
            s == status && !(s == 503 && only_not_synced_yet(body))
        })
    }

    /// Polls /debug/resources until its `problems` (as JSON text) satisfy `pred`, within
    /// `timeout`; that text.
    pub fn wait_problems(
        &self,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&str) -> bool,
    ) -> String {
        wait_for(timeout, what, || {
            let problems = self.debug()["problems"].to_string();
            pred(&problems).then_some(problems)
        })
    }

    /// GET on the admin port.
    pub fn get(&self, path: &str) -> (u16, String) {
        http_get(self.admin, path).expect("admin GET")
    }

    /// /debug/resources as JSON.
    pub fn debug(&self) -> serde_json::Value {
        serde_json::from_str(&self.get("/debug/resources").1).expect("debug JSON")
    }

    /// Sends SIGTERM and waits up to `timeout` for the process to exit; its exit status.
    pub fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        self.process.terminate(timeout)
    }

    /// What the adapter logged so far.
    pub fn log(&self) -> String {
        self.process.log()
    }

    /// The last 30 lines of the log, for assertion messages.
    pub fn log_tail(&self) -> String {
        self.process.log_tail(30)
    }

    /// Sum of a metric's samples on /metrics (0 when absent).
    pub fn metric(&self, name: &str) -> f64 {
        metric_sum(&self.get("/metrics").1, name)
    }

    /// Sum of a metric's samples whose labels include `label` (`verb="apply"`).
    pub fn metric_with(&self, name: &str, label: &str) -> f64 {
        let text = self.get("/metrics").1;
        let lines: String = text
            .lines()
            .filter(|l| l.contains(label))
            .map(|l| format!("{l}\n"))
            .collect();
        metric_sum(&lines, name)
    }

    /// Requests the Kubernetes output sent with `verb` (`apply`, `delete`, `list`), any answer.
    pub fn kube_writes(&self, verb: &str) -> f64 {
        self.metric_with(
            "mcp_adapter_kube_output_requests_total",
            &format!("verb=\"{verb}\""),
        )
    }

    /// Asserts that the adapter counted no registry error; `context` says when.
    pub fn assert_no_registry_errors(&self, context: &str) {
        assert_eq!(
            self.metric("mcp_adapter_registry_errors_total"),
            0.0,
            "registry errors {context}; log:\n{}",
            self.log_tail()
        );
    }

    /// Steady state with nothing changing in the registry, observed for `window`: no registry
    /// errors, ready, and not one new snapshot (nothing is re-listed or re-pushed).
    pub fn assert_steady(&self, window: Duration) {
        self.assert_steady_polling(window, Duration::from_millis(250), &[]);
    }

    /// Steady again after registry errors, observed for `window`: the error count no longer
    /// grows, `/registryz` and `/readyz` answer 200, and not one new snapshot is built.
    pub fn assert_recovered(&self, window: Duration) {
        let errors = self.metric("mcp_adapter_registry_errors_total");
        let snapshots = self.metric("mcp_adapter_snapshots_total");
        let end = Instant::now() + window;
        while Instant::now() < end {
            for path in ["/registryz", "/readyz"] {
                let (status, body) = self.get(path);
                assert_eq!(
                    status,
                    200,
                    "{path} after recovery: {body}; log:\n{}",
                    self.log_tail()
                );
            }
            assert_eq!(
                self.metric("mcp_adapter_registry_errors_total"),
                errors,
                "registry errors after recovery; log:\n{}",
                self.log_tail()
            );
            assert_eq!(
                self.metric("mcp_adapter_snapshots_total"),
                snapshots,
                "a snapshot was built while nothing changed; log:\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// [`Adapter::assert_steady`], looking every `every`, with `also` (admin paths) answering
    /// 200 too.
    pub fn assert_steady_polling(&self, window: Duration, every: Duration, also: &[&str]) {
        let snapshots = self.metric("mcp_adapter_snapshots_total");
        assert!(snapshots > 0.0, "no snapshot yet");
        let end = Instant::now() + window;
        while Instant::now() < end {
            self.assert_no_registry_errors("in steady state");
            for path in ["/readyz"].iter().chain(also) {
                let (status, body) = self.get(path);
                assert_eq!(
                    status,
                    200,
                    "{path} in steady state: {body}; log:\n{}",
                    self.log_tail()
                );
            }
            assert_eq!(
                self.metric("mcp_adapter_snapshots_total"),
                snapshots,
                "a snapshot was built while nothing changed; log:\n{}",
                self.log_tail()
            );
            std::thread::sleep(every);
        }
    }
}

/// Whether a 503 from /registryz says only that nothing has been tried yet: the registry line is
/// `<registry> not synced yet` with no error, and the Kubernetes output's line, if any, reports
/// no failure (one that has not looked at its Lease yet, a replica that follows, or a leader
/// with nothing wrong; a conflict, a refused Lease or a write error is a report worth
/// returning, even before the registry's first sync).
fn only_not_synced_yet(body: &str) -> bool {
    let mut lines = body.lines();
    let registry_line = lines.next().unwrap_or_default();
    registry_line.ends_with(" not synced yet")
        && lines.all(|l| {
            l.starts_with("kube output: starting")
                || l.starts_with("kube output: following")
                || (l.starts_with("kube output: leader")
                    && !l.contains("(last error")
                    && !l.contains("; "))
        })
}

#[cfg(test)]
mod tests {
    use super::only_not_synced_yet;

    #[test]
    fn the_start_up_503_is_told_from_a_report() {
        assert!(only_not_synced_yet("file not synced yet\n"));
        assert!(only_not_synced_yet(
            "file not synced yet\nkube output: starting (Lease ns/mcp-adapter-file not looked at yet)\n"
        ));
        assert!(only_not_synced_yet(
            "file not synced yet\nkube output: following (Lease ns/mcp-adapter-file held by another replica)\n"
        ));
        assert!(only_not_synced_yet(
            "file not synced yet\nkube output: leader, API server in step (0 objects)\n"
        ));
        assert!(!only_not_synced_yet(
            "consul not synced yet (last error: connection refused)\n"
        ));
        assert!(!only_not_synced_yet(
            "file not synced yet\nkube output: not writing: Lease ns/mcp-adapter-file is held by adapter-a, configured differently\n"
        ));
        assert!(!only_not_synced_yet(
            "file not synced yet\nkube output: leader, API server 2 objects behind for 1.0s (last error: 500)\n"
        ));
        assert!(!only_not_synced_yet(
            "file healthy\nkube output: following (Lease x held by another replica)\n"
        ));
    }
}
