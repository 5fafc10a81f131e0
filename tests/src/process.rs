//! A test peer's process (an adapter, Consul, ZooKeeper, Eureka, the API server, istiod, Envoy):
//! started with stdin closed and its output appended to a log file, waited for until it
//! answers (failing at once, with its log, if it exits first), killed and reaped on drop.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::tail;

/// Starts `cmd` with stdin and stdout piped (a peer driven through them), stderr to `stderr`.
pub fn spawn_piped(cmd: &mut Command, stderr: Stdio) -> Child {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", cmd.get_program().display()))
}

/// How many of the log's last lines a failure message shows.
const LOG_TAIL: usize = 100;

/// One peer's process, restartable; killed on drop.
pub struct Process {
    name: String,
    log: PathBuf,
    poll: Duration,
    child: Mutex<Option<Child>>,
}

impl Process {
    /// Nothing runs yet; `name` is what messages call it, its output goes to `<dir>/<name>.log`,
    /// `poll` is how often [`Process::wait_until`] asks whether it is ready.
    pub fn new(name: &str, dir: &Path, poll: Duration) -> Process {
        Process {
            name: name.to_string(),
            log: dir.join(format!("{name}.log")),
            poll,
            child: Mutex::new(None),
        }
    }

    /// Starts `cmd` (killing the process first if it runs), stdout and stderr appended to the
    /// log.
    pub fn spawn(&self, cmd: &mut Command) {
        let stdout = self.open_log();
        self.spawn_with_stdout(cmd, Stdio::from(stdout));
    }

    /// [`Process::spawn`] with stdout going to `stdout` instead (stderr still to the log).
    pub fn spawn_with_stdout(&self, cmd: &mut Command, stdout: Stdio) {
        self.kill();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(self.open_log())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "spawn {} for {}: {e}",
                    cmd.get_program().display(),
                    self.name
                )
            });
        *self.child() = Some(child);
    }

    fn open_log(&self) -> std::fs::File {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap_or_else(|e| panic!("{} log {}: {e}", self.name, self.log.display()))
    }

    fn child(&self) -> MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Kills the process (SIGKILL) if it runs, and reaps it.
    pub fn kill(&self) {
        if let Some(mut c) = self.child().take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child().as_ref().map(Child::id)
    }

    /// How the process ended, once it has.
    fn exited(&self) -> Option<ExitStatus> {
        self.child().as_mut()?.try_wait().ok().flatten()
    }

    /// Sends SIGTERM and waits up to `timeout` for the process to exit; its exit status.
    pub fn terminate(&self, timeout: Duration) -> Option<ExitStatus> {
        let pid = self.pid()?;
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if let Some(status) = self.exited() {
                *self.child() = None;
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Polls `ready` until it holds; panics with the log's tail if the process exits first or
    /// `timeout` passes (`what` says what was waited for).
    pub fn wait_until(&self, timeout: Duration, what: &str, ready: impl FnMut() -> bool) {
        self.wait_until_or(timeout, what, ready, String::new);
    }

    /// [`Process::wait_until`], with `detail()` added to the message on a timeout.
    pub fn wait_until_or(
        &self,
        timeout: Duration,
        what: &str,
        mut ready: impl FnMut() -> bool,
        detail: impl Fn() -> String,
    ) {
        let end = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exited() {
                panic!(
                    "{} exited ({status}) before {what}; its log:\n{}",
                    self.name,
                    self.log_tail(LOG_TAIL)
                );
            }
            if ready() {
                return;
            }
            assert!(
                Instant::now() < end,
                "{}: no {what} within {timeout:?}; its log:\n{}{}",
                self.name,
                self.log_tail(LOG_TAIL),
                detail()
            );
            std::thread::sleep(self.poll);
        }
    }

    /// The log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// What the process logged so far (every run).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log(), lines)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The process listening on TCP port `port` of this network namespace (any address), if one
/// does and it can be found: its pid and command line. Read from `/proc/net/tcp{,6}` (the
/// listening socket's inode) and `/proc/<pid>/fd` (who holds that inode).
pub fn listener_of(port: u16) -> Option<(u32, String)> {
    let inodes: Vec<String> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|text| {
            text.lines()
                .skip(1)
                .filter_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    let local_port = f.get(1)?.rsplit_once(':')?.1;
                    // State 0A is LISTEN.
                    (u16::from_str_radix(local_port, 16).ok()? == port && *f.get(3)? == "0A")
                        .then(|| f.get(9).map(|i| i.to_string()))
                        .flatten()
                })
                .collect::<Vec<_>>()
        })
        .collect();
    if inodes.is_empty() {
        return None;
    }
    let wanted: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|t| wanted.iter().any(|w| t.as_os_str() == w.as_str()))
        });
        if holds {
            let cmdline = std::fs::read(entry.path().join("cmdline"))
                .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
                .unwrap_or_default();
            return Some((pid, cmdline.trim().to_string()));
        }
    }
    None
}

#[cfg(test)]
mod listener_tests {
    use super::listener_of;

    #[test]
    fn finds_this_process_listening_and_nothing_once_closed() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        let (pid, cmd) = listener_of(port).expect("found");
        assert_eq!(pid, std::process::id());
        assert!(!cmd.is_empty());
        drop(l);
        assert_eq!(listener_of(port), None);
    }
}
