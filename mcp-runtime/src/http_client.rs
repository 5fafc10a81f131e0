//! The HTTP client of the adapters that poll a registry over HTTP (Consul, Eureka): built from
//! TLS files (CA bundle, CA directory, client certificate) and rebuilt when one changes, so a
//! certificate rotation needs no restart.
//!
//! The connection pool keeps at most `max_idle` idle connections per host: Consul's agent refuses
//! more than `limits.http_max_conns_per_client` (default 200) open connections from one address,
//! and idle keep-alive connections count too (hence `idle_timeout`). The callers bound the
//! requests in flight.
//!
//! Bodies are read through [`ReloadingClient::body`], never whole and unchecked: a registry (or
//! something posing as one) that answers without end would otherwise take all the memory. A body
//! over `--max-response-size` is an error naming the URL and the limit; the caller's watch then
//! fails like an outage and the last good state stays served.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::secret::FileStamp;

/// Default of `--max-response-size`: far above a large registry's answer (Consul's catalog of
/// 5,000 services is about 1 MiB, Eureka's `/apps` about 1.2 KiB per instance), far below memory.
pub const DEFAULT_MAX_RESPONSE: u64 = 64 << 20;

/// How often the TLS files are checked for changes (a `stat` each; requests between checks use
/// the current client).
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// Why the HTTP client cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// A TLS file is missing or unreadable.
    #[error("reading {what} {path}: {source}")]
    Read {
        /// Which setting.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A TLS file does not hold what it should.
    #[error("{what} {path}: {message}")]
    Invalid {
        /// Which setting.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// reqwest refused the settings.
    #[error("HTTP client: {0}")]
    Build(String),
}

/// Why a response body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// The body is larger than the cap (said by `Content-Length`, or found while reading).
    #[error("the answer of {url} is larger than --max-response-size {} ({limit} bytes); raise it if the registry is really this large", mcp_core::parse::format_size(*.limit))]
    TooLarge {
        /// Where it came from (its query too; never credentials: they travel in headers).
        url: String,
        /// The cap.
        limit: u64,
    },
    /// The connection failed while reading.
    #[error("reading the answer of {url}: {message}")]
    Read {
        /// Where it came from.
        url: String,
        /// What failed.
        message: String,
    },
}

/// What the HTTP client is built from.
#[derive(Clone, Debug)]
pub struct HttpSettings {
    /// Who the client talks to, for log lines (`Consul`, `Eureka`).
    pub peer: &'static str,
    /// CA bundle (PEM).
    pub ca: Option<PathBuf>,
    /// Directory of CA certificates (PEM files).
    pub capath: Option<PathBuf>,
    /// Client certificate and key (PEM).
    pub identity: Option<(PathBuf, PathBuf)>,
    /// Verify the server's certificate.
    pub verify: bool,
    /// Resolve this name to this address (verify a server name while connecting to an IP).
    pub resolve: Option<(String, SocketAddr)>,
    /// Idle connections kept per host.
    pub max_idle: usize,
    /// How long an idle connection is kept.
    pub idle_timeout: Duration,
    /// Longest one request may take (none: the caller bounds it).
    pub timeout: Option<Duration>,
    /// Longest a connection may take to open.
    pub connect_timeout: Duration,
    /// Largest response body read ([`ReloadingClient::body`]).
    pub max_response: u64,
}

impl HttpSettings {
    /// Plain settings for `peer`: system roots, verification on, no client certificate.
    pub fn new(peer: &'static str) -> Self {
        Self {
            peer,
            ca: None,
            capath: None,
            identity: None,
            verify: true,
            resolve: None,
            max_idle: usize::MAX,
            idle_timeout: Duration::from_secs(90),
            timeout: None,
            connect_timeout: Duration::from_secs(5),
            max_response: DEFAULT_MAX_RESPONSE,
        }
    }

    /// Every file the client depends on, with its current stamp.
    fn stamps(&self) -> Vec<(PathBuf, Option<FileStamp>)> {
        let mut files: Vec<PathBuf> = Vec::new();
        files.extend(self.ca.iter().cloned());
        if let Some((c, k)) = &self.identity {
            files.push(c.clone());
            files.push(k.clone());
        }
        if let Some(dir) = &self.capath {
            files.push(dir.clone());
            files.extend(pem_files(dir));
        }
        files
            .into_iter()
            .map(|f| {
                let s = FileStamp::of(&f);
                (f, s)
            })
            .collect()
    }

    /// Builds a client from the files as they are now.
    pub fn build(&self) -> Result<reqwest::Client, HttpError> {
        let mut b = reqwest::Client::builder()
            .connect_timeout(self.connect_timeout)
            .pool_max_idle_per_host(self.max_idle)
            .pool_idle_timeout(self.idle_timeout)
            .tcp_keepalive(Duration::from_secs(60));
        if let Some(t) = self.timeout {
            b = b.timeout(t);
        }
        let mut cas: Vec<PathBuf> = self.ca.iter().cloned().collect();
        if let Some(dir) = &self.capath {
            // Reading the directory itself must work; its files are the CAs.
            std::fs::read_dir(dir).map_err(|source| HttpError::Read {
                what: "CA directory",
                path: dir.clone(),
                source,
            })?;
            cas.extend(pem_files(dir));
        }
        for ca in &cas {
            let pem = read(ca, "CA")?;
            let certs =
                reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| HttpError::Invalid {
                    what: "CA",
                    path: ca.clone(),
                    message: e.to_string(),
                })?;
            for c in certs {
                b = b.add_root_certificate(c);
            }
        }
        if let Some((cert, key)) = &self.identity {
            let mut pem = read(cert, "client certificate")?;
            pem.push(b'\n');
            pem.extend(read(key, "client key")?);
            let id = reqwest::Identity::from_pem(&pem).map_err(|e| HttpError::Invalid {
                what: "client certificate",
                path: cert.clone(),
                message: e.to_string(),
            })?;
            b = b.identity(id);
        }
        if !self.verify {
            b = b.danger_accept_invalid_certs(true);
        }
        if let Some((name, addr)) = &self.resolve {
            b = b.resolve(name, *addr);
        }
        b.build().map_err(|e| HttpError::Build(e.to_string()))
    }
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, HttpError> {
    std::fs::read(path).map_err(|source| HttpError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

/// The regular files of a CA directory, sorted (hidden files and subdirectories skipped, as
/// Kubernetes volumes keep their versions in `..data` directories).
fn pem_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// The body of `resp`, refused when over `limit` bytes.
async fn read_capped(mut resp: reqwest::Response, limit: u64) -> Result<bytes::Bytes, BodyError> {
    let url = resp.url().to_string();
    let too_large = |url: String| BodyError::TooLarge { url, limit };
    if resp.content_length().is_some_and(|n| n > limit) {
        return Err(too_large(url));
    }
    let mut body = bytes::BytesMut::new();
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                if (body.len() + chunk.len()) as u64 > limit {
                    return Err(too_large(url));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(body.freeze()),
            Err(e) => {
                return Err(BodyError::Read {
                    url,
                    message: mcp_core::clip::error_chain(&e.without_url()),
                })
            }
        }
    }
}

/// A client that follows its TLS files.
#[derive(Debug)]
pub struct ReloadingClient {
    settings: HttpSettings,
    current: Mutex<Current>,
}

#[derive(Debug)]
struct Current {
    client: reqwest::Client,
    stamps: Vec<(PathBuf, Option<FileStamp>)>,
    checked: Instant,
}

impl ReloadingClient {
    /// Builds the first client; fails when the files are unusable now.
    pub fn new(settings: HttpSettings) -> Result<Self, HttpError> {
        let stamps = settings.stamps();
        let client = settings.build()?;
        Ok(Self {
            settings,
            current: Mutex::new(Current {
                client,
                stamps,
                checked: Instant::now(),
            }),
        })
    }

    /// The body of `resp`, at most [`HttpSettings::max_response`] bytes: a larger one is refused
    /// as soon as its `Content-Length` or the bytes read so far say so, without reading the rest.
    pub async fn body(&self, resp: reqwest::Response) -> Result<bytes::Bytes, BodyError> {
        read_capped(resp, self.settings.max_response).await
    }

    /// The client to use now: rebuilt first if a TLS file changed since it was built. A file
    /// that is mid-rotation (unreadable or invalid) keeps the previous client and is tried
    /// again at the next check.
    pub fn get(&self) -> reqwest::Client {
        let mut cur = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if cur.checked.elapsed() >= CHECK_EVERY {
            cur.checked = Instant::now();
            let stamps = self.settings.stamps();
            if stamps != cur.stamps {
                match self.settings.build() {
                    Ok(client) => {
                        tracing::info!(
                            peer = self.settings.peer,
                            "TLS files changed; new connections use them."
                        );
                        cur.client = client;
                        cur.stamps = stamps;
                    }
                    Err(error) => {
                        tracing::warn!(peer = self.settings.peer, %error, "TLS files changed but cannot be used yet; keeping the previous ones.");
                    }
                }
            }
        }
        cur.client.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A one-shot HTTP server on loopback answering every request with `head` and then `body`
    /// `repeat` times; its URL.
    async fn serve(head: &'static str, body: &'static [u8], repeat: usize) -> String {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = l.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(head.as_bytes()).await;
                for _ in 0..repeat {
                    if s.write_all(body).await.is_err() {
                        break;
                    }
                }
            }
        });
        format!("http://{addr}/v1/catalog/services?index=7")
    }

    async fn fetch(url: &str, limit: u64) -> Result<bytes::Bytes, BodyError> {
        let mut settings = HttpSettings::new("Test");
        settings.max_response = limit;
        let client = ReloadingClient::new(settings).expect("client");
        let resp = client.get().get(url).send().await.expect("response");
        client.body(resp).await
    }

    #[tokio::test]
    async fn bodies_over_the_cap_are_refused_naming_url_and_limit() {
        // Within the cap.
        let url = serve("HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n", b"{}[]", 1).await;
        assert_eq!(&fetch(&url, 4).await.expect("fits")[..], b"{}[]");

        // Said by Content-Length: refused before reading (the server sends only part of it).
        let url = serve(
            "HTTP/1.1 200 OK\r\ncontent-length: 1000000\r\n\r\n",
            b"[",
            1,
        )
        .await;
        let e = fetch(&url, 1024).await.expect_err("too large");
        let msg = e.to_string();
        assert!(
            matches!(e, BodyError::TooLarge { limit: 1024, .. }),
            "{e:?}"
        );
        assert!(
            msg.contains(&url) && msg.contains("--max-response-size 1 KiB"),
            "{msg}"
        );

        // No length (the connection closes at the end): found while reading, the rest unread.
        let url = serve(
            "HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n",
            b"0123456789abcdef",
            100_000,
        )
        .await;
        let e = fetch(&url, 64 << 10).await.expect_err("too large");
        assert!(matches!(e, BodyError::TooLarge { .. }), "{e:?}");
    }
}
