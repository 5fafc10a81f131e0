//! The mesh's client side: requests through a sidecar's outbound listener, by host, one at a
//! time ([`request`]) or as a steady load ([`Load`]) whose every outcome is kept.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One HTTP/1.1 request to `proxy` (a sidecar's `127.0.0.1:<service port>` listener) for
/// `host`, with extra `headers`, on a connection of its own: `Ok(body)` (the backend's name)
/// for a 200, else `Err` with the status line, Envoy's response flags and body.
pub fn request(proxy: SocketAddr, host: &str, headers: &[(&str, &str)]) -> Result<String, String> {
    let mut s = TcpStream::connect_timeout(&proxy, Duration::from_secs(2))
        .map_err(|e| format!("connect {proxy}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let _ = s.set_nodelay(true);
    let mut req = format!("GET / HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())
        .map_err(|e| format!("send to {proxy}: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .map_err(|e| format!("read from {proxy}: {e}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status == "200" {
        Ok(body.trim().to_string())
    } else {
        // Envoy's own answers say why in the body ("no healthy upstream", "upstream connect
        // error or disconnect/reset before headers. reset reason: ...").
        Err(format!(
            "{host}: {}: {}",
            head.lines().next().unwrap_or("no answer"),
            body.trim()
        ))
    }
}

/// `n` requests in a row; the backends that answered, counted. Panics on the first failure.
pub fn spread(
    proxy: SocketAddr,
    host: &str,
    headers: &[(&str, &str)],
    n: usize,
) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for i in 0..n {
        let name = request(proxy, host, headers)
            .unwrap_or_else(|e| panic!("request {i} of {n} to {host} failed: {e}"));
        *seen.entry(name).or_insert(0) += 1;
    }
    seen
}

/// One TCP connection to `addr`: the first line the backend sent (its name).
pub fn tcp_greeting(addr: SocketAddr) -> Result<String, String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .map_err(|e| format!("read from {addr}: {e}"))?;
    let text = String::from_utf8_lossy(&raw).trim().to_string();
    if text.is_empty() {
        Err(format!("{addr}: closed without a greeting"))
    } else {
        Ok(text)
    }
}

/// What one request of a [`Load`] got.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// When it was sent.
    pub at: Instant,
    /// The backend that answered, or why it failed.
    pub result: Result<String, String>,
}

/// A steady load of requests for one host, from a few threads, until [`Load::stop`].
pub struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Vec<Outcome>>>,
    /// When it started.
    pub started: Instant,
}

impl Load {
    /// About `rate` requests a second for `host` through `proxy`, spread over `threads`
    /// threads, each request on a new connection (so every one is routed afresh).
    pub fn start(proxy: SocketAddr, host: &str, rate: u32, threads: u32) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let period = Duration::from_secs_f64(f64::from(threads.max(1)) / f64::from(rate.max(1)));
        let started = Instant::now();
        let threads = (0..threads.max(1))
            .map(|i| {
                let stop = stop.clone();
                let host = host.to_string();
                std::thread::spawn(move || {
                    // Staggered, so the threads do not fire together.
                    let mut next = started + period.mul_f64(f64::from(i) / f64::from(threads));
                    let mut out = Vec::new();
                    while !stop.load(Ordering::SeqCst) {
                        let now = Instant::now();
                        if next > now {
                            std::thread::sleep(next - now);
                        }
                        next += period;
                        let at = Instant::now();
                        out.push(Outcome {
                            at,
                            result: request(proxy, &host, &[]),
                        });
                    }
                    out
                })
            })
            .collect();
        Load {
            stop,
            threads,
            started,
        }
    }

    /// Stops it; every outcome, in the order sent.
    pub fn stop(self) -> Report {
        self.stop.store(true, Ordering::SeqCst);
        let mut outcomes: Vec<Outcome> = join_all(self.threads);
        outcomes.sort_by_key(|o| o.at);
        Report {
            elapsed: self.started.elapsed(),
            outcomes,
        }
    }
}

/// Every thread's outcomes. A thread that panicked panics the caller with its payload: its
/// outcomes are lost, and the others alone could still meet a rate or failure bound.
fn join_all<T>(threads: Vec<std::thread::JoinHandle<Vec<T>>>) -> Vec<T> {
    threads
        .into_iter()
        .flat_map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
        .collect()
}

/// What a [`Load`] saw.
#[derive(Debug)]
pub struct Report {
    /// How long it ran.
    pub elapsed: Duration,
    /// Every request, in the order sent.
    pub outcomes: Vec<Outcome>,
}

impl Report {
    /// Requests per second it achieved.
    pub fn rate(&self) -> f64 {
        self.outcomes.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The failed requests' errors.
    pub fn failures(&self) -> Vec<&str> {
        self.outcomes
            .iter()
            .filter_map(|o| o.result.as_ref().err().map(String::as_str))
            .collect()
    }

    /// Panics unless every request was answered and the load ran at `min_rate` requests/s at
    /// least; `what` names the scenario in the message.
    pub fn assert_all_answered(&self, what: &str, min_rate: f64) {
        let failures = self.failures();
        assert!(
            failures.is_empty(),
            "{what}: {} of {} requests failed: {:?}",
            failures.len(),
            self.outcomes.len(),
            &failures[..failures.len().min(10)]
        );
        assert!(
            self.rate() >= min_rate,
            "{what}: the load ran at {:.0} requests/s, not {min_rate}",
            self.rate()
        );
    }

    /// Answers per backend.
    pub fn by_backend(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for o in &self.outcomes {
            if let Ok(b) = &o.result {
                *m.entry(b.clone()).or_insert(0) += 1;
            }
        }
        m
    }
}

#[cfg(test)]
mod join_tests {
    use std::panic::{catch_unwind, AssertUnwindSafe};

    use super::join_all;

    #[test]
    fn a_panicking_load_thread_panics_the_report() {
        let ok = std::thread::spawn(|| vec![1, 2]);
        let bad = std::thread::spawn(|| -> Vec<i32> { panic!("a load thread failed") });
        let joined = catch_unwind(AssertUnwindSafe(|| join_all(vec![ok, bad])));
        let payload = joined.expect_err("the panic reaches the caller");
        assert_eq!(
            payload.downcast_ref::<&str>(),
            Some(&"a load thread failed")
        );
        let fine = join_all(vec![
            std::thread::spawn(|| vec![3]),
            std::thread::spawn(|| vec![4]),
        ]);
        assert_eq!(fine, [3, 4]);
    }
}
