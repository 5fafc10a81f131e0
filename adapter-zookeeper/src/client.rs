//! The ZooKeeper client shared by every watch: built on demand, rebuilt when it cannot recover.
//!
//! `zookeeper-async` resolves the ensemble once, when the client is built, keeps only the first
//! address of each host name, and fails the whole build (`BadArguments`) when one member does
//! not resolve; after that it retries exactly those addresses forever. So this module resolves
//! the ensemble itself, every time a watch starts:
//!
//! * every address of every member is used; members that do not resolve (a StatefulSet pod not
//!   yet created) are skipped with a warning instead of failing the whole ensemble;
//! * a cached client whose resolved addresses differ from the current ones (a member moved) is
//!   replaced, and so is one that reached a state it never leaves (`AuthFailed`, `Closed`, its
//!   IO task gone): [`Clients::discard`];
//! * while resolution fails altogether the cached client is kept (a DNS hiccup must not end a
//!   working session);
//! * building a client waits for a TCP connection to one of the addresses; a build that gets
//!   none within [`BUILD_WAIT`] is dropped, nothing is cached, and the next watch resolves again.
//!
//! Watches are armed with the requests' plain `watch` flag, and every event reaches the
//! client's default watcher, which routes it to the running watch ([`Client::route_to`]): the
//! library keeps a watcher object per `_w` request until its znode changes, across reconnects
//! and session expiries, so re-arming every watch after each reconnect would pile them up.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use mcp_core::RegistryError;
use tokio::sync::{mpsc, watch, Mutex};
use tokio::time::timeout;
use zookeeper_async::{WatchedEvent, ZkState, ZooKeeper};

use crate::watches::{fired, Hint};

/// Where the client's default watcher sends fired watches: the running watch's channel.
type Route = Arc<std::sync::Mutex<Option<mpsc::UnboundedSender<Hint>>>>;

/// Longest a client build may take (it does not wait for a session).
const BUILD_WAIT: Duration = Duration::from_secs(10);
/// Delay between the client's reconnect attempts (0 would be a tight loop while ZK is down).
const RETRY_TIME: Duration = Duration::from_millis(500);
/// How long a discarded client gets to close its session politely.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// What the state listener has seen: the transitions, the last state, and how many times the
/// server said the session had expired.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Seen {
    /// Transitions seen.
    pub transitions: u64,
    /// The last state.
    pub state: ZkState,
    /// Sessions expired so far. The client passes through `NotConnected` only when the server
    /// answers a reconnect with "expired" (and then opens a new session at once, silently), so
    /// the watch counts them here: by the time it looks, the state may be `Connected` again.
    pub expired: u64,
}

/// One built client and its state as the listener reports it.
#[derive(Clone)]
pub struct Client {
    /// The handle.
    pub zk: Arc<ZooKeeper>,
    /// What the state listener has seen.
    pub state: watch::Receiver<Seen>,
    /// The addresses it was built with.
    addrs: Vec<SocketAddr>,
    /// Where fired watches go.
    route: Route,
}

impl Client {
    /// Sends the watches that fire from now on to `hints` (the watch that starts; the one
    /// before it has ended, and its channel is dropped here).
    pub(crate) fn route_to(&self, hints: mpsc::UnboundedSender<Hint>) {
        let mut route = self.route.lock().unwrap_or_else(|p| p.into_inner());
        *route = Some(hints);
    }
}

/// The client's default watcher: every event of a watch armed by this client comes here (none
/// is armed with a watcher object of its own), and goes to the watch that runs.
fn default_watcher(route: Route) -> impl Fn(WatchedEvent) + Send + 'static {
    move |ev: WatchedEvent| {
        let hints = fired(&ev);
        if hints.is_empty() {
            tracing::debug!(event = ?ev, "ZooKeeper event without a watch.");
            return;
        }
        tracing::debug!(path = ?ev.path, event = ?ev.event_type, "ZooKeeper watch fired.");
        let route = route.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = route.as_ref() {
            for h in hints {
                // A closed channel: the watch ended; the next one lists everything anyway.
                let _ = tx.send(h);
            }
        }
    }
}

/// States after which the handle never works again: the client must be rebuilt.
pub fn is_terminal(state: ZkState) -> bool {
    matches!(state, ZkState::AuthFailed | ZkState::Closed)
}

/// Why a cached client built for `built` must be replaced, given its state and the addresses
/// the ensemble resolves to now (`None`: resolution failed, which alone is no reason).
pub fn rebuild_reason(
    state: ZkState,
    built: &[SocketAddr],
    now: Option<&[SocketAddr]>,
) -> Option<&'static str> {
    if is_terminal(state) {
        Some("the client reached a terminal state")
    } else if now.is_some_and(|now| now != built) {
        Some("the ensemble resolves to other addresses")
    } else {
        None
    }
}

/// The ensemble as resolved now.
#[derive(Debug, PartialEq, Eq)]
pub struct Ensemble {
    /// Every address of every member that resolved, in connect-string order, no duplicates.
    pub addrs: Vec<SocketAddr>,
    /// The chroot suffix (`/app`), or empty.
    pub chroot: String,
    /// Members that did not resolve, with why.
    pub unresolved: Vec<String>,
}

impl Ensemble {
    /// The connect string handed to the client: addresses only, so it resolves nothing.
    pub fn connect_string(&self) -> String {
        let hosts: Vec<String> = self.addrs.iter().map(SocketAddr::to_string).collect();
        format!("{}{}", hosts.join(","), self.chroot)
    }
}

/// Resolves `host:port,host:port[/chroot]`; an error only when no member resolves.
pub async fn resolve(servers: &str) -> Result<Ensemble, String> {
    let (hosts, chroot) = match servers.find('/') {
        Some(i) => servers.split_at(i),
        None => (servers, ""),
    };
    let chroot = if chroot == "/" { "" } else { chroot };
    let mut addrs = Vec::new();
    let mut unresolved = Vec::new();
    for member in hosts.split(',').map(str::trim).filter(|m| !m.is_empty()) {
        match tokio::net::lookup_host(member).await {
            Ok(found) => {
                let mut any = false;
                for a in found {
                    any = true;
                    if !addrs.contains(&a) {
                        addrs.push(a);
                    }
                }
                if !any {
                    unresolved.push(format!("{member}: no address"));
                }
            }
            Err(e) => unresolved.push(format!("{member}: {e}")),
        }
    }
    if addrs.is_empty() {
        return Err(if unresolved.is_empty() {
            format!("no ZooKeeper server in {servers:?}")
        } else {
            format!("no ZooKeeper server resolves ({})", unresolved.join("; "))
        });
    }
    Ok(Ensemble {
        addrs,
        chroot: chroot.to_string(),
        unresolved,
    })
}

/// The cached client of one registry.
pub struct Clients {
    servers: String,
    session_timeout: Duration,
    slot: Mutex<Option<Client>>,
}

impl Clients {
    /// No client yet: the first [`Clients::get`] builds it.
    pub fn new(servers: String, session_timeout: Duration) -> Self {
        Self {
            servers,
            session_timeout,
            slot: Mutex::new(None),
        }
    }

    /// The client to use: the cached one unless it is terminal or the ensemble now resolves to
    /// other addresses, else a new one.
    pub async fn get(&self) -> Result<Client, RegistryError> {
        let mut slot = self.slot.lock().await;
        let ensemble = resolve(&self.servers).await;
        if let Some(c) = slot.as_ref() {
            let state = c.state.borrow().state;
            let now = ensemble.as_ref().ok().map(|e| e.addrs.as_slice());
            let Some(why) = rebuild_reason(state, &c.addrs, now) else {
                return Ok(c.clone());
            };
            tracing::warn!(servers = %self.servers, state = ?state, why, "Rebuilding the ZooKeeper client.");
            if let Some(old) = slot.take() {
                close_in_background(old);
            }
        }
        let ensemble = ensemble.map_err(RegistryError::Unavailable)?;
        for member in &ensemble.unresolved {
            tracing::warn!(member = %member, "A ZooKeeper server does not resolve; using the others.");
        }
        let connect = ensemble.connect_string();
        tracing::info!(servers = %self.servers, addresses = %connect, "Connecting to ZooKeeper.");
        let route: Route = Arc::default();
        let built = ZooKeeper::connect_with_retry_time(
            &connect,
            self.session_timeout,
            default_watcher(Arc::clone(&route)),
            RETRY_TIME,
        );
        let zk = match timeout(BUILD_WAIT, built).await {
            Err(_) => {
                return Err(RegistryError::Unavailable(format!(
                    "cannot connect to ZooKeeper at {connect} within {BUILD_WAIT:?}"
                )))
            }
            Ok(Err(e)) => {
                return Err(RegistryError::Unavailable(format!(
                    "cannot connect to ZooKeeper at {connect}: {e:?}"
                )))
            }
            Ok(Ok(zk)) => zk,
        };
        let (state_tx, state_rx) = watch::channel(Seen {
            transitions: 0,
            state: ZkState::Connecting,
            expired: 0,
        });
        zk.add_listener(move |s: ZkState| {
            tracing::info!(state = ?s, "ZooKeeper connection state changed.");
            state_tx.send_modify(|v| {
                v.transitions += 1;
                v.state = s;
                // Deprecated in the crate's docs, yet the one state its IO task sets when the
                // server answers a reconnect with "session expired" (zookeeper-async 5.0.0).
                #[allow(deprecated)]
                let expired = s == ZkState::NotConnected;
                if expired {
                    v.expired += 1;
                }
            });
        });
        let client = Client {
            zk: Arc::new(zk),
            state: state_rx,
            addrs: ensemble.addrs,
            route,
        };
        *slot = Some(client.clone());
        Ok(client)
    }

    /// Forgets the cached client (it reached a state it does not leave): the next
    /// [`Clients::get`] builds a new one, resolving the ensemble again.
    pub async fn discard(&self, why: &str) {
        if let Some(old) = self.slot.lock().await.take() {
            tracing::warn!(servers = %self.servers, why, "Discarding the ZooKeeper client.");
            close_in_background(old);
        }
    }
}

/// Closes a replaced client's session without waiting for it (its IO task may be stuck
/// reconnecting to a server that is gone, in which case the close never completes).
fn close_in_background(old: Client) {
    tokio::spawn(async move {
        if timeout(CLOSE_WAIT, old.zk.close()).await.is_err() {
            tracing::debug!("The replaced ZooKeeper client did not close in time.");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn resolves_every_member_it_can() {
        let e = resolve("127.0.0.1:2181, no-such-host.invalid:2181,127.0.0.1:2181/app")
            .await
            .expect("one member resolves");
        assert_eq!(e.addrs, ["127.0.0.1:2181".parse().expect("addr")]);
        assert_eq!(e.chroot, "/app");
        assert_eq!(e.unresolved.len(), 1, "{:?}", e.unresolved);
        assert!(e.unresolved[0].starts_with("no-such-host.invalid:2181"));
        assert_eq!(e.connect_string(), "127.0.0.1:2181/app");
        let v6 = resolve("[::1]:2181,localhost:2182/").await.expect("v6");
        assert_eq!(v6.chroot, "");
        assert!(v6.connect_string().starts_with("[::1]:2181,"), "{v6:?}");
        assert!(resolve("no-such-host.invalid:2181").await.is_err());
        assert!(resolve("").await.is_err());
    }

    #[test]
    fn rebuilds_after_terminal_states_and_moves_only() {
        let a: SocketAddr = "10.0.0.1:2181".parse().expect("addr");
        let b: SocketAddr = "10.0.0.2:2181".parse().expect("addr");
        assert_eq!(rebuild_reason(ZkState::Connected, &[a], Some(&[a])), None);
        assert_eq!(
            rebuild_reason(ZkState::Connecting, &[a], None),
            None,
            "a failed lookup keeps a working client"
        );
        assert!(rebuild_reason(ZkState::Connecting, &[a], Some(&[b])).is_some());
        assert!(rebuild_reason(ZkState::Connecting, &[a], Some(&[a, b])).is_some());
        assert!(rebuild_reason(ZkState::AuthFailed, &[a], Some(&[a])).is_some());
        assert!(rebuild_reason(ZkState::Closed, &[a], None).is_some());
    }

    #[tokio::test]
    async fn get_caches_and_discard_rebuilds() {
        // A socket that accepts connections and never answers: the client builds (it needs a
        // TCP connection, not a session).
        let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = silent.local_addr().expect("addr");
        let clients = Clients::new(addr.to_string(), Duration::from_secs(10));
        let first = clients.get().await.expect("built");
        let again = clients.get().await.expect("cached");
        assert!(Arc::ptr_eq(&first.zk, &again.zk));
        clients.discard("test").await;
        let rebuilt = clients.get().await.expect("rebuilt");
        assert!(!Arc::ptr_eq(&first.zk, &rebuilt.zk));
        let none = Clients::new("no-such-host.invalid:2181".into(), Duration::from_secs(10));
        assert!(none.get().await.is_err());
    }

    #[test]
    fn terminal_states() {
        assert!(is_terminal(ZkState::AuthFailed));
        assert!(is_terminal(ZkState::Closed));
        assert!(!is_terminal(ZkState::Connecting));
        assert!(!is_terminal(ZkState::Connected));
    }
}
