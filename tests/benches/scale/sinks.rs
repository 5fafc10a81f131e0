//! The xDS sinks, in a separate process so that neither their memory nor their CPU is the
//! adapter's: this bench binary re-executed with `--sinks ADDR COUNT sotw|delta` opens COUNT
//! streams at once and prints a line per response; [`SinkProc`] is that process seen from the
//! bench, reading those lines.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use proto::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};

use crate::util::now_ns;
use crate::xds::{subscribe, LightDelta, LightSotw};
use crate::PUSH_TIMEOUT;

/// Child mode: one SotW sink; prints `RESP <idx> <ns> <resources> <bytes> <version>` per response
/// (after ACKing it).
async fn sotw_sink(addr: SocketAddr, idx: usize) -> Result<(), String> {
    let (tx, mut stream) = subscribe::<DiscoveryRequest, LightSotw>(addr, idx).await?;
    while let Some((bytes, r)) = stream.message().await.map_err(|e| e.to_string())? {
        let t = now_ns();
        let resources = r
            .resources
            .iter()
            .filter(|a| a.type_url == proto::MCP_RESOURCE_TYPE_URL)
            .count();
        tx.send(DiscoveryRequest {
            version_info: r.version_info.clone(),
            response_nonce: r.nonce.clone(),
            type_url: r.type_url.clone(),
            ..Default::default()
        })
        .map_err(|e| e.to_string())?;
        println!("RESP {idx} {t} {resources} {bytes} {}", r.version_info);
    }
    Err("the server ended the stream".into())
}

/// Child mode: one delta sink; prints `DELTA <idx> <ns> <resources> <bytes> <names|->` per
/// response (after ACKing it).
async fn delta_sink(addr: SocketAddr, idx: usize) -> Result<(), String> {
    let (tx, mut stream) = subscribe::<DeltaDiscoveryRequest, LightDelta>(addr, idx).await?;
    while let Some((bytes, r)) = stream.message().await.map_err(|e| e.to_string())? {
        let t = now_ns();
        tx.send(DeltaDiscoveryRequest {
            type_url: r.type_url.clone(),
            response_nonce: r.nonce.clone(),
            ..Default::default()
        })
        .map_err(|e| e.to_string())?;
        let names = if r.resources.len() <= 16 && !r.resources.is_empty() {
            r.resources
                .iter()
                .map(|e| e.name.as_str())
                .collect::<Vec<_>>()
                .join(",")
        } else {
            "-".into()
        };
        println!("DELTA {idx} {t} {} {bytes} {names}", r.resources.len());
    }
    Err("the server ended the stream".into())
}

/// What the sinks subscribe with.
#[derive(Clone, Copy, PartialEq)]
pub enum Mode {
    Sotw,
    Delta,
}

/// Child process entry: `--sinks ADDR COUNT sotw|delta`. Prints `START <ns>`, opens all streams
/// at once, and holds them until stdin closes.
pub fn sinks_main(args: &[String]) {
    let addr: SocketAddr = args
        .first()
        .and_then(|a| a.parse().ok())
        .expect("--sinks ADDR COUNT MODE");
    let count: usize = args
        .get(1)
        .and_then(|a| a.parse().ok())
        .expect("--sinks ADDR COUNT MODE");
    let mode = match args.get(2).map(String::as_str) {
        Some("delta") => Mode::Delta,
        _ => Mode::Sotw,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async move {
        println!("START {}", now_ns());
        for idx in 0..count {
            tokio::spawn(async move {
                let result = match mode {
                    Mode::Sotw => sotw_sink(addr, idx).await,
                    Mode::Delta => delta_sink(addr, idx).await,
                };
                if let Err(e) = result {
                    println!("ERR {idx} {e}");
                }
            });
        }
        let _ = tokio::task::spawn_blocking(|| {
            let mut buf = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut buf);
        })
        .await;
    });
    rt.shutdown_timeout(Duration::from_secs(1));
}

/// A line of the sinks' process.
pub enum Line {
    Start(u64),
    Resp {
        idx: usize,
        t: u64,
        resources: usize,
        bytes: u64,
    },
    Delta {
        t: u64,
        resources: usize,
        names: Vec<String>,
    },
}

/// The sinks' child process, seen from the parent.
pub struct SinkProc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

/// When the sinks connected (START) and when the last of them held the full set.
#[derive(Clone, Copy, Debug)]
pub struct Push {
    start_ns: u64,
    last_ns: u64,
    /// Size of one full response on the wire.
    pub bytes: u64,
}

impl Push {
    pub fn secs(self) -> f64 {
        (self.last_ns.saturating_sub(self.start_ns)) as f64 / 1e9
    }
}

impl SinkProc {
    pub fn spawn(addr: SocketAddr, count: usize, mode: Mode) -> SinkProc {
        let mut child = Command::new(std::env::current_exe().expect("current exe"))
            .args([
                "--sinks",
                &addr.to_string(),
                &count.to_string(),
                if mode == Mode::Delta { "delta" } else { "sotw" },
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn sinks");
        let stdout = child.stdout.take().expect("child stdout");
        let stdin = child.stdin.take();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        SinkProc {
            child,
            stdin,
            lines,
        }
    }

    /// The next line before `deadline`; panics on `ERR`, on timeout and on an exited child.
    pub fn next(&self, deadline: Instant, what: &str) -> Line {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match self.lines.recv_timeout(left) {
                Ok(l) => l,
                Err(mpsc::RecvTimeoutError::Timeout) => panic!("timed out waiting for {what}"),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("the sinks' process ended while waiting for {what}")
                }
            };
            let f: Vec<&str> = line.split_whitespace().collect();
            let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            match f.first().copied() {
                Some("START") => return Line::Start(num(1)),
                Some("RESP") => {
                    return Line::Resp {
                        idx: num(1) as usize,
                        t: num(2),
                        resources: num(3) as usize,
                        bytes: num(4),
                    }
                }
                Some("DELTA") => {
                    return Line::Delta {
                        t: num(2),
                        resources: num(3) as usize,
                        names: f
                            .get(5)
                            .filter(|n| **n != "-")
                            .map(|n| n.split(',').map(str::to_string).collect())
                            .unwrap_or_default(),
                    }
                }
                Some("ERR") => panic!("sink failed while waiting for {what}: {line}"),
                _ => eprintln!("[scale] sinks: {line}"),
            }
        }
    }

    /// Waits until `count` sinks each hold `expect` resources.
    pub fn wait_full(&self, count: usize, expect: usize) -> Push {
        let deadline = Instant::now() + PUSH_TIMEOUT;
        let what = format!("{count} sink(s) to hold {expect} resources");
        let mut start_ns = 0;
        let mut held = BTreeSet::new();
        let mut push = Push {
            start_ns: 0,
            last_ns: 0,
            bytes: 0,
        };
        while held.len() < count {
            match self.next(deadline, &what) {
                Line::Start(t) => start_ns = t,
                Line::Resp {
                    idx,
                    t,
                    resources,
                    bytes,
                } if resources == expect && held.insert(idx) => {
                    push.last_ns = push.last_ns.max(t);
                    push.bytes = bytes;
                }
                Line::Delta { t, resources, .. } if resources == expect => {
                    held.insert(0);
                    push.last_ns = t;
                }
                _ => {}
            }
        }
        push.start_ns = start_ns;
        push
    }

    /// `count` sinks connect to `addr` at once; returns when the last holds `expect` resources
    /// and closes them.
    pub fn push(addr: SocketAddr, count: usize, expect: usize) -> Push {
        let sinks = SinkProc::spawn(addr, count, Mode::Sotw);
        let push = sinks.wait_full(count, expect);
        sinks.close();
        push
    }

    pub fn close(mut self) {
        drop(self.stdin.take());
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for SinkProc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
