//! The official Nacos Java client in processes of their own, registering over gRPC as Spring
//! Cloud Alibaba and Dubbo services do: [`Registrar`] (the client's `NamingService`, driven over
//! stdin) and [`DubboProvider`] (a Dubbo 3 provider registering itself through Dubbo's own Nacos
//! registry). Both work with either server line; they are built by `tests/nacos/build.sh`.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::nacos::{Nacos, ADMIN_PASSWORD, ADMIN_USER};
use crate::{peer_file, tail};

/// The Java registrar (the official client driven over stdin).
pub fn registrar_jar() -> PathBuf {
    peer_file(
        "NACOS_REGISTRAR_JAR",
        "nacos/nacos-registrar.jar",
        "tests/nacos/build.sh target/nacos",
    )
}

/// How long the registrar's JVM may take to start and connect on two busy cores.
const REGISTRAR_READY_TIMEOUT: Duration = Duration::from_secs(120);

/// How long one registrar command may take (a gRPC request and its answer; `many`: one per
/// service).
const REGISTRAR_COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// The official Java client (`nacos-client` 2.4.3) in a process of its own, registering and
/// deregistering ephemeral instances over gRPC on command; killed on drop (its instances then
/// vanish as its connection closes, as when a service crashes).
///
/// Register one instance per service with each registrar, as a Spring Cloud Alibaba service
/// does: Nacos keeps one instance per service and connection (a second `register` of the same
/// service replaces the first), and the client registers only the last again after a
/// reconnect. Start a second registrar for a second instance, or use [`Registrar::batch`].
pub struct Registrar {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    dir: tempfile::TempDir,
}

impl Registrar {
    /// Starts the client against `nacos` (as its admin when it requires a login) in
    /// `namespace` (None: the client's default, public) and waits until it is connected.
    pub fn start(nacos: &Nacos, namespace: Option<&str>) -> Registrar {
        let dir = tempfile::tempdir().expect("tempdir");
        let stderr = std::fs::File::create(dir.path().join("registrar.log")).expect("log file");
        let mut cmd = Command::new("java");
        // C1 only, a small heap and the serial collector: starts in half the time on two busy
        // cores. The client's cache and log directories go to the temporary directory instead
        // of ~/nacos and ~/logs.
        cmd.args(["-Xmx128m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"])
            .arg(format!("-DJM.SNAPSHOT.PATH={}", dir.path().display()))
            .arg(format!(
                "-DJM.LOG.PATH={}",
                dir.path().join("logs").display()
            ))
            .arg("-jar")
            .arg(registrar_jar())
            .args(["--server", &nacos.server_addr()]);
        if let Some(ns) = namespace {
            cmd.args(["--namespace", ns]);
        }
        if nacos.auth() {
            cmd.args(["--username", ADMIN_USER, "--password", ADMIN_PASSWORD]);
        }
        let mut child = crate::process::spawn_piped(&mut cmd, Stdio::from(stderr));
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        let mut r = Registrar {
            child,
            stdin,
            lines,
            dir,
        };
        let first = r.reply(REGISTRAR_READY_TIMEOUT, "ready");
        assert_eq!(
            first,
            "ready",
            "nacos registrar did not start; its log:\n{}",
            r.log_tail()
        );
        r
    }

    /// Registers an ephemeral instance of `service` in `group` on `ip:port` (cluster
    /// `DEFAULT`) with `weight` and `metadata`; returns once the server has accepted it.
    pub fn register(
        &mut self,
        service: &str,
        group: &str,
        ip: &str,
        port: u16,
        weight: f64,
        metadata: &[(&str, &str)],
    ) {
        let mut line = format!("register {service} {group} {ip} {port} {weight}");
        if !metadata.is_empty() {
            let pairs: Vec<String> = metadata.iter().map(|(k, v)| format!("{k}={v}")).collect();
            line.push(' ');
            line.push_str(&pairs.join(","));
        }
        self.cmd(&line);
    }

    /// Registers `count` ephemeral instances of `service` in `group` at once
    /// (`batchRegisterInstance`: one request), on `10.{n/65536}.{n/256%256}.{n%256}` for n in
    /// 1..=count with `port`, each with metadata `pad` of `pad_bytes` bytes: a service whose
    /// every push is large.
    pub fn batch(&mut self, service: &str, group: &str, count: usize, port: u16, pad_bytes: usize) {
        self.cmd(&format!(
            "batch {service} {group} {count} {port} {pad_bytes}"
        ));
    }

    /// Registers one ephemeral instance on `ip:port` in each of `count` services named
    /// `{prefix}-{n}` (n from 0) of `group`, one request each: an application with many
    /// interfaces.
    pub fn many(&mut self, prefix: &str, group: &str, count: usize, ip: &str, port: u16) {
        self.cmd(&format!("many {prefix} {group} {count} {ip} {port}"));
    }

    /// Deregisters the instance of `service` in `group` on `ip:port`.
    pub fn deregister(&mut self, service: &str, group: &str, ip: &str, port: u16) {
        self.cmd(&format!("deregister {service} {group} {ip} {port}"));
    }

    /// `shutDown()` of the client (its connection closes, so its instances go), then waits for
    /// the process to exit.
    pub fn shutdown(mut self) {
        self.cmd("quit");
        // Closing stdin as well: the registrar exits on either.
        self.stdin = None;
        let end = Instant::now() + REGISTRAR_COMMAND_TIMEOUT;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    assert!(
                        status.success(),
                        "nacos registrar exited with {status}; its log:\n{}",
                        self.log_tail()
                    );
                    return;
                }
                Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(20)),
                other => panic!(
                    "nacos registrar did not exit after quit ({other:?}); its log:\n{}",
                    self.log_tail()
                ),
            }
        }
    }

    /// Stops the client's process (SIGSTOP) or lets it go on (SIGCONT): a client that hangs, so
    /// that it reconnects (and registers again) only when it goes on.
    pub fn pause(&self, paused: bool) {
        let sig = if paused { "-STOP" } else { "-CONT" };
        let _ = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status();
    }

    /// The client's log (stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("registrar.log")
    }

    fn log_tail(&self) -> String {
        tail(&self.log(), 60)
    }

    /// Sends one command and waits for its `ok`; panics with the log on `error` or timeout.
    fn cmd(&mut self, line: &str) {
        assert!(!line.contains('\n'), "one line per command: {line:?}");
        let stdin = self.stdin.as_mut().expect("registrar stdin open");
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| panic!("write {line:?} to the nacos registrar: {e}"));
        let reply = self.reply(REGISTRAR_COMMAND_TIMEOUT, line);
        assert_eq!(
            reply,
            format!("ok {line}"),
            "nacos registrar {line:?}; its log:\n{}",
            self.log_tail()
        );
    }

    /// The next protocol line (`ready`, `ok ...`, `error ...`); other output is skipped. Panics
    /// with the log if none comes within `timeout` or the process ends.
    fn reply(&mut self, timeout: Duration, what: &str) -> String {
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l == "ready" || l.starts_with("ok ") || l.starts_with("error ") => {
                    return l
                }
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                    "nacos registrar: no answer to {what:?} within {timeout:?}; its log:\n{}",
                    self.log_tail()
                ),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait();
                    panic!(
                        "nacos registrar exited ({status:?}) before answering {what:?}; its log:\n{}",
                        self.log_tail()
                    )
                }
            }
        }
    }
}

impl Drop for Registrar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Dubbo provider jar (tests/nacos/dubbo-provider).
pub fn dubbo_provider_jar() -> PathBuf {
    peer_file(
        "DUBBO_PROVIDER_JAR",
        "nacos/dubbo-provider.jar",
        "tests/nacos/build.sh target/nacos",
    )
}

/// How Dubbo registers a provider in Nacos (its `register-mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DubboMode {
    /// Dubbo 2's interface level: services `providers:INTERFACE:VERSION:GROUP`, one instance per
    /// protocol.
    Interface,
    /// Dubbo 3's application level: service APP, one instance with `dubbo.endpoints`.
    Instance,
    /// Both, as Dubbo 3 does by default while applications migrate.
    All,
}

/// A Dubbo 3 provider of `dev.meshbridge.dubboprovider.Greeter` (version 1.0.0) that registers
/// itself through Dubbo's own Nacos registry: `dubbo` on one port, Triple (`tri`) on another,
/// both bound to and registered as its own address. Its `greet(name)` answers
/// `hello NAME from APP@IP:PORT via PROTOCOL`. Stopped on drop (its instances go with its
/// connection).
pub struct DubboProvider {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    dir: tempfile::TempDir,
}

/// The interface every [`DubboProvider`] exports.
pub const GREETER: &str = "dev.meshbridge.dubboprovider.Greeter";

impl DubboProvider {
    /// Starts a provider named `app` on `ip` (`dubbo` on `dubbo_port`, Triple on `tri_port`)
    /// registering in `nacos` (as its admin when it requires a login), in `namespace` (None:
    /// public), at `mode`; returns once Dubbo has exported and registered it.
    pub fn start(
        nacos: &Nacos,
        namespace: Option<&str>,
        mode: DubboMode,
        app: &str,
        ip: &str,
        dubbo_port: u16,
        tri_port: u16,
    ) -> DubboProvider {
        let dir = tempfile::tempdir().expect("tempdir");
        let stderr = std::fs::File::create(dir.path().join("dubbo.log")).expect("log file");
        let mode = match mode {
            DubboMode::Interface => "interface",
            DubboMode::Instance => "instance",
            DubboMode::All => "all",
        };
        let mut cmd = Command::new("java");
        cmd.args(["-Xmx192m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"])
            .arg(format!("-Duser.home={}", dir.path().display()))
            .arg(format!("-DJM.SNAPSHOT.PATH={}", dir.path().display()))
            .arg(format!(
                "-DJM.LOG.PATH={}",
                dir.path().join("logs").display()
            ))
            .arg("-jar")
            .arg(dubbo_provider_jar())
            .args([
                "--nacos",
                &nacos.server_addr(),
                "--mode",
                mode,
                "--app",
                app,
            ])
            .args(["--ip", ip, "--dubbo-port", &dubbo_port.to_string()])
            .args(["--tri-port", &tri_port.to_string(), "--version", "1.0.0"]);
        if let Some(ns) = namespace {
            cmd.args(["--namespace", ns]);
        }
        if nacos.auth() {
            cmd.args(["--username", ADMIN_USER, "--password", ADMIN_PASSWORD]);
        }
        let mut child = crate::process::spawn_piped(&mut cmd, Stdio::from(stderr));
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        let p = DubboProvider {
            child,
            stdin,
            lines,
            dir,
        };
        match p.lines.recv_timeout(REGISTRAR_READY_TIMEOUT) {
            Ok(l) if l == "ready" => p,
            other => panic!(
                "the Dubbo provider {app} did not get ready ({other:?}); its log:\n{}",
                tail(&p.log(), 60)
            ),
        }
    }

    /// Its log (stderr: Dubbo's and the Nacos client's).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("dubbo.log")).unwrap_or_default()
    }

    /// Unregisters and stops (`quit`), then waits for its `bye`.
    pub fn stop(mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = writeln!(stdin, "quit");
        }
        let bye = self.lines.recv_timeout(REGISTRAR_COMMAND_TIMEOUT);
        assert_eq!(
            bye.as_deref(),
            Ok("bye"),
            "the Dubbo provider did not stop; its log:\n{}",
            tail(&self.log(), 40)
        );
    }
}

impl Drop for DubboProvider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
