//! One address in front of several replicas, as a Kubernetes Service is for a Deployment's pods:
//! each new connection goes to the next replica that accepts it (a replica that is down refuses
//! and the next one is tried, as kube-proxy's endpoints drop a pod that is not ready), and bytes
//! are copied both ways until either side closes. When a replica dies, its connections close,
//! and the client's reconnect lands on a live one. It counts the bytes the replicas sent back
//! (what a client such as istiod received through it). [`Forwarder::cutting_idle`] also closes
//! every connection on which nothing moved either way for a while, as a proxy or cloud load
//! balancer with an idle timeout does (AWS's 60 s, nginx's `proxy_read_timeout`).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A running forwarder; stops accepting on drop.
pub struct Forwarder {
    /// Where clients connect.
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// Connections made so far, per replica index.
    picks: Arc<Mutex<Vec<usize>>>,
    /// Bytes copied from the replicas to the clients.
    received: Arc<AtomicU64>,
    /// Connections closed for being idle.
    cuts: Arc<AtomicUsize>,
}

impl Forwarder {
    /// Listens on a free loopback port and forwards to `replicas`, in turn.
    pub fn start(replicas: Vec<SocketAddr>) -> Forwarder {
        Self::run(replicas, None)
    }

    /// Forwards to `upstream`, closing both ends of a connection once nothing moved on it
    /// either way for `idle`.
    pub fn cutting_idle(upstream: SocketAddr, idle: Duration) -> Forwarder {
        Self::run(vec![upstream], Some(idle))
    }

    fn run(replicas: Vec<SocketAddr>, idle: Option<Duration>) -> Forwarder {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind forwarder");
        let addr = listener.local_addr().expect("local addr");
        let stop = Arc::new(AtomicBool::new(false));
        let picks = Arc::new(Mutex::new(vec![0; replicas.len()]));
        let next = Arc::new(AtomicUsize::new(0));
        let received = Arc::new(AtomicU64::new(0));
        let cuts = Arc::new(AtomicUsize::new(0));
        let (s, p, r, c) = (stop.clone(), picks.clone(), received.clone(), cuts.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = conn else { continue };
                let first = next.fetch_add(1, Ordering::SeqCst);
                let upstream = (0..replicas.len()).find_map(|i| {
                    let idx = (first + i) % replicas.len();
                    TcpStream::connect_timeout(&replicas[idx], Duration::from_secs(1))
                        .ok()
                        .map(|u| (idx, u))
                });
                // No replica up: the client's connection closes, as with no ready endpoint.
                let Some((idx, upstream)) = upstream else {
                    continue;
                };
                p.lock().expect("picks")[idx] += 1;
                let idle = idle.map(|after| Idle::new(after, c.clone()));
                pipe(client, upstream, r.clone(), idle);
            }
        });
        Forwarder {
            addr,
            stop,
            picks,
            received,
            cuts,
        }
    }

    /// Connections closed so far for being idle ([`Forwarder::cutting_idle`]).
    pub fn cuts(&self) -> usize {
        self.cuts.load(Ordering::SeqCst)
    }

    /// Connections forwarded so far to each replica.
    pub fn picks(&self) -> Vec<usize> {
        self.picks.lock().expect("picks").clone()
    }

    /// Bytes the replicas sent to clients so far.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
    }
}

/// One connection's idle clock, shared by its two directions.
#[derive(Clone)]
struct Idle {
    after: Duration,
    started: std::time::Instant,
    /// Milliseconds from `started` to the last byte either way.
    last: Arc<AtomicU64>,
    /// Set by the direction that closes the connection, so that a cut counts once.
    cut: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
}

impl Idle {
    fn new(after: Duration, cuts: Arc<AtomicUsize>) -> Idle {
        Idle {
            after,
            started: std::time::Instant::now(),
            last: Arc::new(AtomicU64::new(0)),
            cut: Arc::new(AtomicBool::new(false)),
            cuts,
        }
    }

    fn moved(&self) {
        let now = self.started.elapsed().as_millis() as u64;
        self.last.store(now, Ordering::SeqCst);
    }

    /// Whether the connection is to be closed now (counted once).
    fn expired(&self) -> bool {
        let since = self.started.elapsed().as_millis() as u64 - self.last.load(Ordering::SeqCst);
        if since < self.after.as_millis() as u64 {
            return false;
        }
        if !self.cut.swap(true, Ordering::SeqCst) {
            self.cuts.fetch_add(1, Ordering::SeqCst);
        }
        true
    }
}

/// Copies both ways on two threads, counting what `upstream` sends into `received`; when one
/// direction ends (or the connection was idle too long), both sockets are shut down.
fn pipe(client: TcpStream, upstream: TcpStream, received: Arc<AtomicU64>, idle: Option<Idle>) {
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (Ok(c2), Ok(u2)) = (client.try_clone(), upstream.try_clone()) else {
        return;
    };
    let i2 = idle.clone();
    std::thread::spawn(move || copy(client, upstream, None, idle));
    std::thread::spawn(move || copy(u2, c2, Some(received), i2));
}

fn copy(mut from: TcpStream, mut to: TcpStream, count: Option<Arc<AtomicU64>>, idle: Option<Idle>) {
    if idle.is_some() {
        // Wake up now and then to look at the idle clock.
        let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
    }
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) => break,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                match &idle {
                    Some(i) if !i.expired() => continue,
                    _ => break,
                }
            }
            Err(_) => break,
            Ok(n) => {
                if let Some(i) = &idle {
                    i.moved();
                }
                if let Some(c) = &count {
                    c.fetch_add(n as u64, Ordering::Relaxed);
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
