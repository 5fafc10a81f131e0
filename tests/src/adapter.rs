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

    /// Polls /registryz until it answers `status`, within `timeout`; the body. A 503 while the
    /// adapter has tried nothing yet (registry not synced, no error, and the Kubernetes output,
    /// when there is one, not failing) is what every adapter answers at its start: it is passed
    /// over, so that waiting for a failure on a newly started adapter returns the failure's
    /// report. That is read from /debug/resources' fields ([`only_not_synced_yet`]), before and
    /// after the /registryz answer, both having to say the same: the two are separate requests.
    pub fn wait_registryz(&self, timeout: Duration, what: &str, status: u16) -> String {
        wait_for(timeout, what, || {
            let before = self.start_up_only()?;
            let (s, body) = http_get(self.admin, "/registryz").ok()?;
            if s != status {
                return None;
            }
            if s == 503 && (before || self.start_up_only()?) {
                return None;
            }
            Some(body)
        })
    }

    /// [`only_not_synced_yet`] on /debug/resources (`limit=1`: one item of each list is enough
    /// to tell it from an empty one; 0 would empty them all), `None` when the admin port cannot
    /// be reached.
    fn start_up_only(&self) -> Option<bool> {
        let (s, body) = http_get(self.admin, "/debug/resources?limit=1").ok()?;
        if s != 200 {
            return None;
        }
        let debug: serde_json::Value = serde_json::from_str(&body).expect("debug JSON");
        Some(only_not_synced_yet(&debug))
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

/// Whether `debug` (/debug/resources) says that nothing has been tried yet: the registry is
/// not synced and has no error, and the Kubernetes output, if on, is not failing (its own
/// `failing`, what makes /registryz 503) and holds no name conflict and no refused object (a
/// conflict, a refused Lease or a write error is a report worth returning, even before the
/// registry's first sync). Panics when a field is missing (a binary older than the field would
/// otherwise read as "nothing wrong").
fn only_not_synced_yet(debug: &serde_json::Value) -> bool {
    let flag = |v: &serde_json::Value, name: &str| {
        v[name]
            .as_bool()
            .unwrap_or_else(|| panic!("/debug/resources without a boolean {name:?}: {v}"))
    };
    let registry_untried = !flag(debug, "synced") && debug["lastError"].is_null();
    let output_untried = match &debug["kubeOutput"] {
        serde_json::Value::Null => true,
        o => {
            let empty = |name: &str| match &o[name] {
                serde_json::Value::Array(a) => a.is_empty(),
                serde_json::Value::Object(m) => m.is_empty(),
                other => panic!("kubeOutput.{name} is not a list: {other}"),
            };
            !flag(o, "failing") && empty("conflicts") && empty("rejected")
        }
    };
    registry_untried && output_untried
}

#[cfg(test)]
mod tests {
    use super::only_not_synced_yet;
    use serde_json::{json, Value};

    /// /debug/resources' fields for a registry `synced` with `last_error`, and `output` (the
    /// Kubernetes output's fields) when on.
    fn debug(synced: bool, last_error: Option<&str>, output: Option<Value>) -> Value {
        let mut d = json!({"synced": synced, "lastError": last_error});
        if let Some(o) = output {
            d["kubeOutput"] = o;
        }
        d
    }

    fn output(failing: bool, conflicts: &[&str], rejected: Value) -> Option<Value> {
        Some(json!({"failing": failing, "conflicts": conflicts, "rejected": rejected}))
    }

    #[test]
    fn the_start_up_503_is_told_from_a_report() {
        assert!(only_not_synced_yet(&debug(false, None, None)));
        assert!(only_not_synced_yet(&debug(
            false,
            None,
            output(false, &[], json!({}))
        )));
        assert!(!only_not_synced_yet(&debug(
            false,
            Some("connection refused"),
            None
        )));
        assert!(!only_not_synced_yet(&debug(true, None, None)));
        // The output fails (a Lease held by an adapter configured differently, a write error, a
        // leader's Lease error, which its line does not even name).
        assert!(!only_not_synced_yet(&debug(
            false,
            None,
            output(true, &[], json!({}))
        )));
        assert!(!only_not_synced_yet(&debug(
            false,
            None,
            output(false, &["ns/a"], json!({}))
        )));
        assert!(!only_not_synced_yet(&debug(
            false,
            None,
            output(false, &[], json!({"ns/a": {"code": 422}}))
        )));
    }

    /// An adapter without the `failing` field is not read as "nothing wrong".
    #[test]
    #[should_panic(expected = "without a boolean \"failing\"")]
    fn an_output_without_its_verdict_is_refused() {
        only_not_synced_yet(&debug(
            false,
            None,
            Some(json!({"conflicts": [], "rejected": {}})),
        ));
    }
}
