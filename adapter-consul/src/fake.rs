//! A scripted Consul HTTP API for unit tests: answers what a test's handler says, records every
//! request, and holds blocking queries (`index` set) until the answer changes or for their
//! `wait`, the way Consul does. It exists for what a real agent cannot be made to do on demand: answer
//! without `X-Consul-Index`, or fail for one service only.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// One recorded request.
#[derive(Clone, Debug)]
pub struct Request {
    /// Path with the query string.
    pub target: String,
    /// `X-Consul-Token`, if sent.
    pub token: Option<String>,
}

impl Request {
    /// The path without the query.
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }

    /// A query parameter.
    pub fn param(&self, name: &str) -> Option<String> {
        let q = self.target.split_once('?')?.1;
        q.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k == name).then(|| v.to_string())
        })
    }
}

/// What the handler answers.
#[derive(Clone, Debug)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// `X-Consul-Index`, if any.
    pub index: Option<String>,
    /// JSON body.
    pub body: String,
    /// When set, the answer is sent only once this is true (looked at every 5 ms, for at
    /// most 5 s): a slow answer that holds no thread of the runtime.
    pub after: Option<Arc<AtomicBool>>,
}

impl Reply {
    /// 200 with an index.
    pub fn ok(index: u64, body: &str) -> Self {
        Self {
            status: 200,
            index: Some(index.to_string()),
            body: body.to_string(),
            after: None,
        }
    }

    /// The same answer, sent once `flag` is set.
    pub fn after(self, flag: Arc<AtomicBool>) -> Self {
        Self {
            after: Some(flag),
            ..self
        }
    }
}

type Handler = dyn Fn(&Request) -> Reply + Send + Sync;

/// The running fake.
pub struct FakeConsul {
    /// Where it listens.
    pub addr: SocketAddr,
    requests: Arc<Mutex<Vec<Request>>>,
}

impl FakeConsul {
    /// Starts it with `handler`. A blocking query whose answer has the same index as asked is
    /// held until the handler answers another index or for its `wait` (capped at 2 s).
    pub async fn start(handler: impl Fn(&Request) -> Reply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let requests: Arc<Mutex<Vec<Request>>> = Arc::default();
        let handler: Arc<Handler> = Arc::new(handler);
        let recorded = Arc::clone(&requests);
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let handler = Arc::clone(&handler);
                let recorded = Arc::clone(&recorded);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&buf).to_string();
                    let target = head.split_whitespace().nth(1).unwrap_or("").to_string();
                    let token = head.lines().find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("x-consul-token")
                            .then(|| v.trim().to_string())
                    });
                    let req = Request { target, token };
                    recorded.lock().expect("lock").push(req.clone());
                    let mut reply = handler(&req);
                    let asked = req.param("index");
                    let wait = req
                        .param("wait")
                        .and_then(|w| w.trim_end_matches("ms").parse::<u64>().ok())
                        .unwrap_or(2000)
                        .min(2000);
                    let until = tokio::time::Instant::now() + Duration::from_millis(wait);
                    // Held while the answer is what was asked for, as Consul holds a blocking
                    // query: until the handler's answer changes or the wait is over.
                    while asked.is_some()
                        && asked == reply.index.clone().or(Some("1".into()))
                        && tokio::time::Instant::now() < until
                    {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        reply = handler(&req);
                    }
                    if let Some(flag) = reply.after.clone() {
                        let end = tokio::time::Instant::now() + Duration::from_secs(5);
                        while !flag.load(Ordering::SeqCst) && tokio::time::Instant::now() < end {
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                    }
                    let mut resp = format!(
                        "HTTP/1.1 {} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
                        reply.status,
                        reply.body.len()
                    );
                    if let Some(i) = &reply.index {
                        resp.push_str(&format!("X-Consul-Index: {i}\r\n"));
                    }
                    resp.push_str("\r\n");
                    resp.push_str(&reply.body);
                    let _ = sock.write_all(resp.as_bytes()).await;
                    let _ = sock.shutdown().await;
                });
            }
        });
        Self { addr, requests }
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().expect("lock").clone()
    }

    /// The blocking queries sent for `service`'s health (its own query, re-armed after each
    /// answer or wait).
    pub fn own_queries(&self, service: &str) -> usize {
        self.requests_to(&format!("/v1/health/service/{service}"))
            .iter()
            .filter(|r| r.param("index").is_some())
            .count()
    }

    /// Requests whose path is `path`.
    pub fn requests_to(&self, path: &str) -> Vec<Request> {
        self.requests()
            .into_iter()
            .filter(|r| r.path() == path)
            .collect()
    }
}

/// A `/v1/health/service/:name` body with one passing instance.
pub fn one_instance(name: &str, address: &str) -> String {
    serde_json::json!([{
        "Node": {"Node": "n1", "Address": "10.9.9.9", "Datacenter": "dc1"},
        "Service": {"ID": format!("{name}-1"), "Service": name, "Address": address, "Port": 8080},
        "Checks": [{"Status": "passing"}]
    }])
    .to_string()
}
