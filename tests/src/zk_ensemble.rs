//! A real three-server ZooKeeper ensemble on loopback (Debian's `zookeeper`, as
//! [`crate::zookeeper`]): each server its own data directory and `myid`, its own client, quorum
//! and election ports on 127.0.0.1. Short ticks (`tickTime=500`, `initLimit=20`,
//! `syncLimit=5`) make an election take a second or two; the limits leave room for a loaded
//! machine (a follower has 10 s to sync, 2.5 s to answer). The four-letter words are all
//! allowed: `srvr` says who leads.

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::zookeeper::{check_jars, four_letter, write_log4j, JARS};
use crate::{free_addr, wait_for, Process};

/// One server of an [`Ensemble`].
struct Server {
    process: Process,
    client: SocketAddr,
    conf: PathBuf,
}

/// Three ZooKeeper servers in one ensemble, killed on drop.
pub struct Ensemble {
    servers: Vec<Server>,
    _dir: tempfile::TempDir,
}

/// What `srvr` says a server is: `leader`, `follower`, or `None` while it does not serve.
pub fn mode(addr: SocketAddr) -> Option<String> {
    let answer = four_letter(addr, "srvr").ok()?;
    answer
        .lines()
        .find_map(|l| l.strip_prefix("Mode: "))
        .map(|m| m.trim().to_string())
}

impl Ensemble {
    /// Writes each server's zoo.cfg and myid, starts all three and waits until they have a
    /// leader and two followers.
    pub fn start() -> Ensemble {
        check_jars();
        let dir = tempfile::tempdir().expect("tempdir");
        let ports: Vec<(SocketAddr, SocketAddr, SocketAddr)> = (0..3)
            .map(|_| (free_addr(), free_addr(), free_addr()))
            .collect();
        let members: String = ports
            .iter()
            .enumerate()
            .map(|(i, (_, quorum, election))| {
                format!(
                    "server.{}=127.0.0.1:{}:{}\n",
                    i + 1,
                    quorum.port(),
                    election.port()
                )
            })
            .collect();
        let mut servers = Vec::new();
        for (i, (client, _, _)) in ports.iter().enumerate() {
            let home = dir.path().join(format!("zk{}", i + 1));
            let conf = home.join("conf");
            let data = home.join("data");
            std::fs::create_dir_all(&conf).expect("conf dir");
            std::fs::create_dir_all(&data).expect("data dir");
            std::fs::write(data.join("myid"), format!("{}\n", i + 1)).expect("myid");
            std::fs::write(
                conf.join("zoo.cfg"),
                format!(
                    "tickTime=500\ninitLimit=20\nsyncLimit=5\ndataDir={}\nclientPort={}\n\
                     clientPortAddress=127.0.0.1\nmaxClientCnxns=0\nadmin.enableServer=false\n\
                     4lw.commands.whitelist=*\nminSessionTimeout=2000\nmaxSessionTimeout=60000\n\
                     {members}",
                    data.display(),
                    client.port()
                ),
            )
            .expect("zoo.cfg");
            write_log4j(&conf);
            servers.push(Server {
                process: Process::new(&format!("zk{}", i + 1), &home, Duration::from_millis(100)),
                client: *client,
                conf,
            });
        }
        let e = Ensemble { servers, _dir: dir };
        for i in 0..3 {
            e.spawn(i);
        }
        e.wait_quorum(3);
        e
    }

    fn spawn(&self, i: usize) {
        let s = &self.servers[i];
        let cp = format!("{}:{}", s.conf.display(), JARS.join(":"));
        s.process.spawn(
            Command::new("java")
                .arg("-cp")
                .arg(cp)
                .arg("-Xmx256m")
                .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
                .arg(s.conf.join("zoo.cfg")),
        );
    }

    /// Waits (generously: JVMs on a loaded machine) until `n` of the running servers serve,
    /// one of them as leader.
    pub fn wait_quorum(&self, n: usize) {
        wait_for(Duration::from_secs(120), "a ZooKeeper quorum", || {
            let modes: Vec<String> = self.servers.iter().filter_map(|s| mode(s.client)).collect();
            (modes.len() >= n && modes.iter().any(|m| m == "leader")).then_some(())
        });
    }

    /// `host:port,host:port,host:port` for `--zk-servers`.
    pub fn servers(&self) -> String {
        let all: Vec<String> = self.servers.iter().map(|s| s.client.to_string()).collect();
        all.join(",")
    }

    /// [`Ensemble::servers`] with server `first` in front: a client (`zookeeper-async`, Java's
    /// with shuffling off) connects to the first one it can.
    pub fn servers_from(&self, first: usize) -> String {
        let mut all = vec![self.servers[first].client.to_string()];
        all.extend(
            (0..self.servers.len())
                .filter(|i| *i != first)
                .map(|i| self.servers[i].client.to_string()),
        );
        all.join(",")
    }

    /// Which server leads now (index), if any.
    pub fn leader(&self) -> Option<usize> {
        self.servers
            .iter()
            .position(|s| mode(s.client).as_deref() == Some("leader"))
    }

    /// Kills server `i` (SIGKILL) and waits until its client port is closed.
    pub fn kill(&self, i: usize) {
        let s = &self.servers[i];
        s.process.kill();
        wait_for(Duration::from_secs(10), "zookeeper port closed", || {
            TcpStream::connect_timeout(&s.client, Duration::from_millis(200))
                .is_err()
                .then_some(())
        });
    }

    /// Starts server `i` again on its data directory.
    pub fn start_again(&self, i: usize) {
        self.spawn(i);
    }

    /// The logs of all servers, for failure messages.
    pub fn logs(&self) -> String {
        self.servers
            .iter()
            .map(|s| s.process.log_tail(40))
            .collect::<Vec<_>>()
            .join("\n---\n")
    }
}
