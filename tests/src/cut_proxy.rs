//! A TCP proxy that can cut its connections, as a network partition that resets connections
//! (or a load balancer dropping them) looks to a client: [`CutProxy::cut`] closes every open
//! connection at once and closes each new one as soon as it is accepted, until
//! [`CutProxy::heal`]. The server behind it sees its connections close and nothing else, so
//! a ZooKeeper session outlives a cut shorter than its timeout and the client reconnects to
//! the same session once healed.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The open connections (both ends of each) and whether new ones are refused.
#[derive(Default)]
struct State {
    cut: AtomicBool,
    open: Mutex<Vec<(TcpStream, TcpStream)>>,
    /// Connections forwarded so far (accepted while not cut).
    forwarded: AtomicU64,
}

/// A running proxy to one upstream address; stops accepting on drop.
pub struct CutProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    state: Arc<State>,
    stop: Arc<AtomicBool>,
}

impl CutProxy {
    /// Listens on a free loopback port and forwards each connection to `upstream`.
    pub fn start(upstream: SocketAddr) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind cut proxy");
        let addr = listener.local_addr().expect("local addr");
        let state = Arc::new(State::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (st, s) = (state.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = conn else { continue };
                if st.cut.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect_timeout(&upstream, Duration::from_secs(5))
                else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (Ok(c2), Ok(s2), Ok(c3), Ok(s3)) = (
                    client.try_clone(),
                    server.try_clone(),
                    client.try_clone(),
                    server.try_clone(),
                ) else {
                    continue;
                };
                st.open
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((c3, s3));
                st.forwarded.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || copy(client, server));
                std::thread::spawn(move || copy(s2, c2));
            }
        });
        CutProxy { addr, state, stop }
    }

    /// Closes every open connection and every new one until [`CutProxy::heal`].
    pub fn cut(&self) {
        self.state.cut.store(true, Ordering::SeqCst);
        self.close_open();
    }

    /// Forwards new connections again.
    pub fn heal(&self) {
        self.state.cut.store(false, Ordering::SeqCst);
    }

    /// Closes every open connection once; new ones are forwarded (a reset, not a partition).
    pub fn reset(&self) {
        self.close_open();
    }

    /// Connections forwarded so far.
    pub fn forwarded(&self) -> u64 {
        self.state.forwarded.load(Ordering::SeqCst)
    }

    fn close_open(&self) {
        let open = std::mem::take(&mut *self.state.open.lock().unwrap_or_else(|p| p.into_inner()));
        for (c, s) in open {
            let _ = c.shutdown(Shutdown::Both);
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.close_open();
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
    }
}

/// Copies `from` to `to` until either side closes, then closes both.
fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = vec![0u8; 64 * 1024];
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
