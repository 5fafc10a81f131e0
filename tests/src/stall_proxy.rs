//! A TCP proxy that can stop answering without closing anything, as a network partition looks
//! to a client: [`StallProxy::stall`] holds every byte on every connection (open ones and those
//! accepted later), in both directions, and [`StallProxy::resume`] delivers what was held and
//! forwards again, as a healed network delivers what the sender's TCP kept retransmitting.
//! Connections end only when an end closes them (and, while stalled, only after a resume: the
//! close is a message like any other).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Whether forwarding is held, and a way to wake the threads waiting for it.
#[derive(Default)]
struct Gate {
    stalled: Mutex<bool>,
    resumed: Condvar,
}

impl Gate {
    /// Returns once forwarding is allowed.
    fn pass(&self) {
        let mut stalled = self.stalled.lock().unwrap_or_else(|p| p.into_inner());
        while *stalled {
            stalled = self
                .resumed
                .wait(stalled)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    fn set(&self, stalled: bool) {
        *self.stalled.lock().unwrap_or_else(|p| p.into_inner()) = stalled;
        self.resumed.notify_all();
    }
}

/// A running proxy to one upstream address; stops accepting on drop.
pub struct StallProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    gate: Arc<Gate>,
    stop: Arc<AtomicBool>,
}

impl StallProxy {
    /// Listens on a free loopback port and forwards each connection to `upstream`.
    pub fn start(upstream: SocketAddr) -> StallProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind stall proxy");
        let addr = listener.local_addr().expect("local addr");
        let gate = Arc::new(Gate::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (g, s) = (gate.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = conn else { continue };
                // Connected even while stalled: a partition does not refuse connections on this
                // side, it just never answers.
                let Ok(server) = TcpStream::connect_timeout(&upstream, Duration::from_secs(5))
                else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
                    continue;
                };
                let (g1, g2) = (g.clone(), g.clone());
                std::thread::spawn(move || copy(client, server, &g1));
                std::thread::spawn(move || copy(s2, c2, &g2));
            }
        });
        StallProxy { addr, gate, stop }
    }

    /// Holds every byte from now on, both ways, on every connection; closes nothing.
    pub fn stall(&self) {
        self.gate.set(true);
    }

    /// Delivers what was held and forwards again.
    pub fn resume(&self) {
        self.gate.set(false);
    }
}

impl Drop for StallProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Held threads would wait forever for a resume that cannot come now.
        self.gate.set(false);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
    }
}

/// Copies `from` to `to`, each chunk (and the end) only when the gate lets it through.
fn copy(mut from: TcpStream, mut to: TcpStream, gate: &Gate) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = from.read(&mut buf).unwrap_or(0);
        gate.pass();
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
