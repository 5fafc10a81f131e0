//! A real ZooKeeper server (Debian package `zookeeper`, installed by
//! `scripts/install-zookeeper.sh`) on a free loopback port, and `zk-writer` (an example of
//! adapter-zookeeper, so that it is never shipped, that holds one session and writes znodes as
//! told, so that tests can create ephemeral nodes that live as long as the writer).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use crate::process::spawn_piped;
use crate::{free_addr, target_dir, wait_for, Adapter, Process};

/// The server's class path (with the configuration directory in front).
pub(crate) const JARS: [&str; 3] = [
    "/usr/share/java/zookeeper.jar",
    "/usr/share/java/slf4j-log4j12.jar",
    "/usr/share/java/log4j-1.2.jar",
];

/// A running standalone ZooKeeper server, killed on drop.
pub struct ZooKeeper {
    process: Process,
    /// Client address.
    pub addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl ZooKeeper {
    /// Writes zoo.cfg and log4j.properties into a temporary directory and starts the server.
    pub fn start() -> ZooKeeper {
        check_jars();
        let dir = tempfile::tempdir().expect("tempdir");
        let addr = free_addr();
        let conf = dir.path().join("conf");
        std::fs::create_dir_all(&conf).expect("conf dir");
        std::fs::create_dir_all(dir.path().join("data")).expect("data dir");
        std::fs::write(
            conf.join("zoo.cfg"),
            format!(
                "tickTime=2000\ndataDir={}\nclientPort={}\nclientPortAddress=127.0.0.1\n\
                 maxClientCnxns=0\nadmin.enableServer=false\n\
                 4lw.commands.whitelist=ruok,srvr,stat,mntr,wchc,cons\n\
                 minSessionTimeout=2000\nmaxSessionTimeout=60000\n",
                dir.path().join("data").display(),
                addr.port()
            ),
        )
        .expect("zoo.cfg");
        write_log4j(&conf);
        let zk = ZooKeeper {
            process: Process::new("zookeeper", dir.path(), Duration::from_millis(50)),
            addr,
            dir,
        };
        zk.spawn();
        zk
    }

    /// [`ZooKeeper::start`], and a [`Writer`] session on it.
    pub fn start_with_writer() -> (ZooKeeper, Writer) {
        let zk = ZooKeeper::start();
        let w = Writer::start(&zk);
        (zk, w)
    }

    fn spawn(&self) {
        let conf = self.dir.path().join("conf");
        let cp = format!("{}:{}", conf.display(), JARS.join(":"));
        self.process.spawn(
            Command::new("java")
                .arg("-cp")
                .arg(cp)
                .arg("-Xmx256m")
                .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
                .arg(conf.join("zoo.cfg")),
        );
        self.process
            .wait_until(Duration::from_secs(60), "ruok -> imok", || {
                four_letter(self.addr, "ruok").is_ok_and(|answer| answer == "imok")
            });
    }

    /// `host:port` for `--zk-servers`.
    pub fn servers(&self) -> String {
        self.addr.to_string()
    }

    /// Kills the server (SIGKILL); data and sessions stay in the data directory.
    pub fn kill(&mut self) {
        self.process.kill();
        wait_for(Duration::from_secs(10), "zookeeper port closed", || {
            TcpStream::connect_timeout(&self.addr, Duration::from_millis(200))
                .is_err()
                .then_some(())
        });
    }

    /// Starts it again on the same port and data directory.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        self.process.log()
    }
}

/// Debian's build logs through log4j 1.2: warnings to the console (the process log).
pub(crate) fn write_log4j(conf: &Path) {
    std::fs::write(
        conf.join("log4j.properties"),
        "log4j.rootLogger=WARN, CONSOLE\n\
         log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender\n\
         log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout\n\
         log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p %c{1} - %m%n\n",
    )
    .expect("log4j.properties");
}

/// Checks the jars are installed.
pub(crate) fn check_jars() {
    for jar in JARS {
        assert!(
            Path::new(jar).exists(),
            "{jar} missing: run scripts/install-zookeeper.sh (the README's test command does)"
        );
    }
}

/// Sends a four-letter command, returns the answer.
pub fn four_letter(addr: SocketAddr, cmd: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.write_all(cmd.as_bytes())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// `target/<profile>/examples/zk-writer`: a test tool, built as an example of adapter-zookeeper
/// (`cargo build -p adapter-zookeeper --examples`; `cargo test --workspace` builds it too).
pub fn writer_bin() -> std::path::PathBuf {
    let p = target_dir().join("examples").join("zk-writer");
    assert!(
        p.exists(),
        "{} not built: run `cargo build -p adapter-zookeeper --examples` first",
        p.display()
    );
    p
}

/// A `zk-writer` process holding one session, killed on drop (its ephemeral nodes then vanish
/// once the server notices, or at once with [`Writer::expire`]).
pub struct Writer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Writer {
    /// Starts a writer connected to `zk`.
    pub fn start(zk: &ZooKeeper) -> Writer {
        Writer::start_on(&zk.servers())
    }

    /// Starts a writer connected to `servers` (`host:port,..`).
    pub fn start_on(servers: &str) -> Writer {
        // It installs no log subscriber: stderr only ever holds why it exited.
        let mut child = spawn_piped(
            Command::new(writer_bin())
                .arg(servers)
                .env("RUST_LOG", "off"),
            Stdio::piped(),
        );
        let stdin = child.stdin.take().expect("stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("zk-writer ready");
        if line.trim() != "ready" {
            let mut why = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut why);
            }
            let _ = child.wait();
            panic!("zk-writer did not start ({servers}): {why}");
        }
        Writer {
            child,
            stdin,
            stdout,
        }
    }

    /// Runs one command; panics unless it answers `ok`.
    pub fn cmd(&mut self, line: &str) {
        let reply = self.try_cmd(line);
        assert_eq!(reply, "ok", "zk-writer {line:?}");
    }

    /// Runs one command, returns the answer (`ok` or `err <reason>`).
    pub fn try_cmd(&mut self, line: &str) -> String {
        assert!(!line.contains('\n'), "one line per command: {line:?}");
        writeln!(self.stdin, "{line}").expect("write to zk-writer");
        self.stdin.flush().expect("flush zk-writer");
        let mut reply = String::new();
        self.stdout.read_line(&mut reply).expect("zk-writer reply");
        reply.trim().to_string()
    }

    /// Runs one command until it succeeds (the writer's own client may still be reconnecting
    /// after a server restart).
    pub fn retry(&mut self, line: &str) {
        wait_for(Duration::from_secs(30), line, || {
            (self.try_cmd(line) == "ok").then_some(())
        });
    }

    /// Persistent node (parents created).
    pub fn create(&mut self, path: &str, data: &str) {
        self.cmd(&format!("create {path} {data}"));
    }

    /// Ephemeral node (parents created persistent).
    pub fn create_e(&mut self, path: &str, data: &str) {
        self.cmd(&format!("create-e {path} {data}"));
    }

    /// Adds digest credentials `user:password` to the writer's session.
    pub fn auth(&mut self, user_password: &str) {
        self.cmd(&format!("auth {user_password}"));
    }

    /// Ephemeral node readable only with the writer's digest credentials.
    pub fn create_private(&mut self, path: &str, data: &str) {
        self.cmd(&format!("create-private {path} {data}"));
    }

    /// Sets a node's data.
    pub fn set(&mut self, path: &str, data: &str) {
        self.cmd(&format!("set {path} {data}"));
    }

    /// Deletes a node (missing is fine).
    pub fn delete(&mut self, path: &str) {
        self.cmd(&format!("delete {path}"));
    }

    /// `{child: {grandchild: data}}` under `path` (`{}` when it is missing), read through the
    /// writer's session; `Err` with the server's answer when the read fails.
    pub fn tree(&mut self, path: &str) -> Result<serde_json::Value, String> {
        let reply = self.try_cmd(&format!("tree {path}"));
        let json = reply.strip_prefix("ok ").ok_or_else(|| reply.clone())?;
        serde_json::from_str(json).map_err(|e| format!("zk-writer tree {path}: {e}: {json}"))
    }

    /// Closes the session: its ephemeral nodes vanish.
    pub fn expire(mut self) {
        self.cmd("expire");
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `java.net.URLEncoder.encode(s, "UTF-8")`, as Dubbo names provider znodes.
pub use adapter_zookeeper::dto::form_encode as url_encode;

/// Path of a Dubbo provider znode under `/dubbo`.
pub fn provider_path(interface: &str, url: &str) -> String {
    format!("/dubbo/{interface}/providers/{}", url_encode(url))
}

/// The pid of a running adapter (found by its unique admin address on its command line).
pub fn adapter_pid(a: &Adapter) -> u32 {
    let needle = a.admin.to_string();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_adapter = args
            .first()
            .is_some_and(|a0| a0.ends_with(b"adapter-zookeeper"));
        if is_adapter && args.contains(&needle.as_bytes()) {
            return pid;
        }
    }
    panic!("adapter process with --admin-listen {needle} not found");
}

/// Sends `signal` (`STOP`, `CONT`) to `pid`.
pub fn signal(pid: u32, signal: &str) {
    let st = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(st.success(), "kill -{signal} {pid}");
}

/// `s` without terminal colour codes (`ESC [ ... m`).
pub fn plain(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A field of a text log line (`name=value`), as a number.
pub fn log_field(line: &str, name: &str) -> Option<u64> {
    let start = line.find(&format!(" {name}="))? + name.len() + 2;
    line.get(start..)?
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}
