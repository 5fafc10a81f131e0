//! One address in front of several replicas, as a Kubernetes Service is for a Deployment's pods:
//! each new connection goes to the next replica that accepts it (a replica that is down refuses
//! and the next one is tried, as kube-proxy's endpoints drop a pod that is not ready), and bytes
//! are copied both ways until either side closes. When a replica dies, its connections close,
//! and the client's reconnect lands on a live one.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A running forwarder; stops accepting on drop.
pub struct Forwarder {
    /// Where clients connect.
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// Connections made so far, per replica index.
    picks: Arc<Mutex<Vec<usize>>>,
}

impl Forwarder {
    /// Listens on a free loopback port and forwards to `replicas`, in turn.
    pub fn start(replicas: Vec<SocketAddr>) -> Forwarder {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind forwarder");
        let addr = listener.local_addr().expect("local addr");
        let stop = Arc::new(AtomicBool::new(false));
        let picks = Arc::new(Mutex::new(vec![0; replicas.len()]));
        let next = Arc::new(AtomicUsize::new(0));
        let (s, p) = (stop.clone(), picks.clone());
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
                pipe(client, upstream);
            }
        });
        Forwarder { addr, stop, picks }
    }

    /// Connections forwarded so far to each replica.
    pub fn picks(&self) -> Vec<usize> {
        self.picks.lock().expect("picks").clone()
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
    }
}

/// Copies both ways on two threads; when one direction ends, both sockets are shut down.
fn pipe(a: TcpStream, b: TcpStream) {
    let _ = a.set_nodelay(true);
    let _ = b.set_nodelay(true);
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    std::thread::spawn(move || copy(a, b));
    std::thread::spawn(move || copy(b2, a2));
}

fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
