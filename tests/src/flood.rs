//! A hostile gRPC peer: many connections, many xDS streams on each, and on each stream requests
//! for many distinct (and long) type URLs, as fast as the server reads them. It reads every
//! response, ACKs none, and records how each stream ended, so a test can check which limit
//! refused it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use tokio_stream::wrappers::ReceiverStream;

/// What to send.
#[derive(Clone, Copy, Debug)]
pub struct Flood {
    /// TCP connections.
    pub connections: usize,
    /// Streams opened on each connection, all at once.
    pub streams_per_connection: usize,
    /// Distinct type URLs each stream asks for, one request each.
    pub types_per_stream: usize,
    /// Length of each type URL, in bytes.
    pub type_url_len: usize,
    /// After its last request, a stream stays open until the flood is stopped (instead of
    /// half-closing).
    pub hold: bool,
}

/// How the streams ended: `"<code>: <message>"` (or `"closed"`, `"connect: ..."`; a stream that
/// held first: `"held, then ..."`) and how many streams ended so.
#[derive(Clone, Debug, Default)]
pub struct FloodReport {
    /// Outcomes and their counts.
    pub outcomes: BTreeMap<String, usize>,
    /// Requests written.
    pub requests: u64,
}

impl FloodReport {
    /// Streams whose outcome contains `text`.
    pub fn count(&self, text: &str) -> usize {
        self.outcomes
            .iter()
            .filter(|(k, _)| k.contains(text))
            .map(|(_, n)| n)
            .sum()
    }

    /// Every stream counted.
    pub fn total(&self) -> usize {
        self.outcomes.values().sum()
    }
}

struct Shared {
    stop: AtomicBool,
    done: AtomicU64,
    /// Streams holding now.
    held: AtomicU64,
    requests: AtomicU64,
    outcomes: Mutex<BTreeMap<String, usize>>,
}

/// A flood under way (its own thread and runtime); stopped on drop.
pub struct FloodRun {
    shared: Arc<Shared>,
    streams: usize,
    thread: Option<JoinHandle<()>>,
}

impl FloodRun {
    /// Starts `flood` against `addr`; returns at once.
    pub fn start(addr: SocketAddr, flood: Flood) -> FloodRun {
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            done: AtomicU64::new(0),
            held: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            outcomes: Mutex::new(BTreeMap::new()),
        });
        let out = shared.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("flood runtime");
            rt.block_on(run(addr, flood, out));
            rt.shutdown_timeout(Duration::from_secs(2));
        });
        FloodRun {
            shared,
            streams: flood.connections * flood.streams_per_connection,
            thread: Some(thread),
        }
    }

    /// Whether every stream has ended or is holding.
    pub fn settled(&self) -> bool {
        let done = self.shared.done.load(Ordering::SeqCst);
        (done + self.shared.held.load(Ordering::SeqCst)) as usize >= self.streams
    }

    /// Streams holding now.
    pub fn holding(&self) -> usize {
        self.shared.held.load(Ordering::SeqCst) as usize
    }

    /// Requests written so far.
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// Tells every stream to stop sending and close; does not wait.
    pub fn stop(&self) {
        self.stopper().stop();
    }

    /// A handle that stops the flood from another thread (a memory watchdog).
    pub fn stopper(&self) -> FloodStopper {
        FloodStopper(self.shared.clone())
    }

    /// Stops the flood, waits for its thread, and reports.
    pub fn finish(mut self) -> FloodReport {
        self.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        FloodReport {
            outcomes: self
                .shared
                .outcomes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            requests: self.requests(),
        }
    }
}

impl Drop for FloodRun {
    fn drop(&mut self) {
        self.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Stops a [`FloodRun`] from anywhere.
#[derive(Clone)]
pub struct FloodStopper(Arc<Shared>);

impl FloodStopper {
    /// Tells every stream to stop sending and close; does not wait.
    pub fn stop(&self) {
        self.0.stop.store(true, Ordering::SeqCst);
    }
}

fn type_url(conn: usize, stream: usize, i: usize, len: usize) -> String {
    let mut t = format!("type.googleapis.com/flood.c{conn}.s{stream}.t{i}.");
    if t.len() < len {
        t.extend(std::iter::repeat_n('x', len - t.len()));
    }
    t
}

fn record(shared: &Shared, outcome: String) {
    *shared
        .outcomes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(outcome)
        .or_default() += 1;
    shared.done.fetch_add(1, Ordering::SeqCst);
}

async fn run(addr: SocketAddr, flood: Flood, shared: Arc<Shared>) {
    let mut tasks = Vec::new();
    for conn in 0..flood.connections {
        let channel = match tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("url")
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
        {
            Ok(c) => c,
            Err(e) => {
                for _ in 0..flood.streams_per_connection {
                    record(&shared, format!("connect: {e}"));
                }
                continue;
            }
        };
        for stream in 0..flood.streams_per_connection {
            let (channel, shared) = (channel.clone(), shared.clone());
            tasks.push(tokio::spawn(async move {
                let outcome = one_stream(channel, flood, conn, stream, &shared).await;
                record(&shared, outcome);
            }));
        }
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// One stream: its requests, while its responses are drained; its outcome.
async fn one_stream(
    channel: tonic::transport::Channel,
    flood: Flood,
    conn: usize,
    stream: usize,
    shared: &Shared,
) -> String {
    let status_text = |s: tonic::Status| format!("{:?}: {}", s.code(), s.message());
    let mut client =
        AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(usize::MAX);
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    let first = DiscoveryRequest {
        type_url: type_url(conn, stream, 0, flood.type_url_len),
        ..Default::default()
    };
    if tx.send(first).await.is_err() {
        return "closed".into();
    }
    shared.requests.fetch_add(1, Ordering::SeqCst);
    let mut responses = match client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
    {
        Ok(r) => r.into_inner(),
        Err(s) => return status_text(s),
    };
    let held = AtomicBool::new(false);
    // Owns the request sender: when it returns, the stream is half-closed.
    let sender = {
        let held = &held;
        async move {
            for i in 1..flood.types_per_stream {
                if shared.stop.load(Ordering::SeqCst) {
                    return;
                }
                let req = DiscoveryRequest {
                    type_url: type_url(conn, stream, i, flood.type_url_len),
                    ..Default::default()
                };
                if tx.send(req).await.is_err() {
                    return;
                }
                shared.requests.fetch_add(1, Ordering::SeqCst);
            }
            if flood.hold {
                held.store(true, Ordering::SeqCst);
                shared.held.fetch_add(1, Ordering::SeqCst);
                while !shared.stop.load(Ordering::SeqCst) && !tx.is_closed() {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    };
    let drain = async {
        loop {
            match responses.message().await {
                Ok(Some(_)) => {}
                Ok(None) => return "closed".to_string(),
                Err(s) => return status_text(s),
            }
        }
    };
    tokio::pin!(sender, drain);
    let outcome = tokio::select! {
        outcome = &mut drain => outcome,
        () = &mut sender => {
            // Half-closed: the server ends the stream.
            match tokio::time::timeout(Duration::from_secs(10), drain).await {
                Ok(o) => o,
                Err(_) => "open after half-close".into(),
            }
        }
    };
    if held.load(Ordering::SeqCst) {
        shared.held.fetch_sub(1, Ordering::SeqCst);
        return format!("held, then {outcome}");
    }
    outcome
}
