//! The services behind the mesh: small HTTP and TCP servers on addresses of their own (the
//! traffic tests' pod network `10.77.x.y`, see `netns`; never 127.0.0.1, where a sidecar without
//! iptables binds the service ports), each answering with its name and remembering when every
//! request reached it, so a test can say which instance a request went to and when traffic to an
//! instance started and stopped.
//!
//! [`Backend::stop`] shuts down the way a real server does on SIGTERM: it stops accepting at
//! once (a new connection is refused, which the proxy retries on another instance), answers a
//! request already on an open connection with `Connection: close`, and closes connections that
//! stay idle for [`DRAIN`]: a proxy that has stopped sending there loses nothing.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a stopped server keeps an idle connection open for a request already on its way.
pub const DRAIN: Duration = Duration::from_secs(2);

/// What every backend shares with its threads.
struct Shared {
    name: String,
    hits: Mutex<Vec<Instant>>,
    stopped_at: Mutex<Option<Instant>>,
    stopping: AtomicBool,
}

impl Shared {
    fn new(name: &str) -> Arc<Shared> {
        Arc::new(Shared {
            name: name.to_string(),
            hits: Mutex::new(Vec::new()),
            stopped_at: Mutex::new(None),
            stopping: AtomicBool::new(false),
        })
    }

    fn hit(&self) {
        self.hits.lock().expect("hits").push(Instant::now());
    }

    /// Stopping, and for longer than the drain time.
    fn drained(&self) -> bool {
        self.stopped_at
            .lock()
            .expect("stopped_at")
            .is_some_and(|t| t.elapsed() >= DRAIN)
    }
}

/// What a backend speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Protocol {
    /// HTTP/1.1 with keep-alive (as the proxy's connection pool expects); every answer is `200`
    /// with the backend's name as the body.
    Http,
    /// A TCP protocol the proxy cannot parse (a stand-in for a Dubbo provider, routed by address
    /// and port only): the backend writes its name and closes each connection.
    Tcp,
}

/// A backend server; stops on drop.
pub struct Backend {
    shared: Arc<Shared>,
    /// Where it listens.
    pub addr: SocketAddr,
    accept: Option<JoinHandle<()>>,
}

impl Backend {
    /// An HTTP server on `addr` (e.g. `10.77.1.2:18080`) answering as `name`.
    pub fn http(name: &str, addr: &str) -> Backend {
        Self::listen(name, addr, Protocol::Http)
    }

    /// A TCP server on `addr` greeting every connection with `name`.
    pub fn tcp(name: &str, addr: &str) -> Backend {
        Self::listen(name, addr, Protocol::Tcp)
    }

    fn listen(name: &str, addr: &str, protocol: Protocol) -> Backend {
        let listener = TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
        let addr = listener.local_addr().expect("local addr");
        let shared = Shared::new(name);
        let s = shared.clone();
        let serve = move |conn: TcpStream| {
            let s = s.clone();
            std::thread::spawn(move || match protocol {
                Protocol::Http => serve_http(conn, &s),
                Protocol::Tcp => greet(conn, &s),
            });
        };
        let stopping = shared.clone();
        let accept = std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                serve(conn);
                if stopping.stopping.load(Ordering::SeqCst) {
                    break;
                }
            }
            // Connections the kernel accepted before the close are served, not reset (a reset
            // after the handshake is a failed request, not a refused connection the proxy
            // retries elsewhere); then the listener drops and new connections are refused.
            if listener.set_nonblocking(true).is_ok() {
                while let Ok((conn, _)) = listener.accept() {
                    let _ = conn.set_nonblocking(false);
                    serve(conn);
                }
            }
        });
        Backend {
            shared,
            addr,
            accept: Some(accept),
        }
    }

    /// Its name (what it answers).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Stops accepting now; open connections drain (see the module docs).
    pub fn stop(&mut self) {
        if self.shared.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        *self.shared.stopped_at.lock().expect("stopped_at") = Some(Instant::now());
        // Wake the accept loop so that it sees the flag and closes the listener (the wake-up
        // connection itself is served like any other: it sends nothing and counts no hit).
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// What a test asks about the traffic that reached a backend.
impl Backend {
    /// Every request (HTTP) or connection (TCP) that reached it, in order.
    pub fn hits(&self) -> Vec<Instant> {
        self.shared.hits.lock().expect("hits").clone()
    }

    /// Requests that reached it.
    pub fn count(&self) -> usize {
        self.hits().len()
    }

    /// Requests that reached it at or after `t`.
    pub fn count_since(&self, t: Instant) -> usize {
        self.hits().iter().filter(|h| **h >= t).count()
    }

    /// The last request that reached it.
    pub fn last_hit(&self) -> Option<Instant> {
        self.hits().last().copied()
    }

    /// The first request that reached it at or after `t`.
    pub fn first_hit_since(&self, t: Instant) -> Option<Instant> {
        self.hits().into_iter().find(|h| *h >= t)
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A TCP connection: one hit, the name, closed. (The wake-up connection of [`Backend::stop`]
/// counts as one too; no test looks at a TCP backend's hits after stopping it.)
fn greet(mut conn: TcpStream, s: &Shared) {
    s.hit();
    let _ = conn.write_all(format!("{}\n", s.name).as_bytes());
}

/// One connection: requests until the peer closes, the server drains, or an answer carried
/// `Connection: close`.
fn serve_http(mut conn: TcpStream, s: &Shared) {
    let _ = conn.set_nodelay(true);
    let _ = conn.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        // A whole request head (and its body, if it says it has one) in `buf`?
        if let Some(end) = find(&buf, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let body_len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            let total = end + 4 + body_len;
            if buf.len() >= total {
                buf.drain(..total);
                s.hit();
                let close = s.stopping.load(Ordering::SeqCst)
                    || head.lines().any(|l| l.trim() == "connection: close");
                let body = format!("{}\n", s.name);
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n{}\r\n{body}",
                    body.len(),
                    if close { "connection: close\r\n" } else { "" }
                );
                if conn.write_all(answer.as_bytes()).is_err() || close {
                    return;
                }
                continue;
            }
        }
        match conn.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                // Idle: a stopped server gives a request on its way the drain time, then closes.
                if buf.is_empty() && s.drained() {
                    return;
                }
            }
            Err(_) => return,
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
