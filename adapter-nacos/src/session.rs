//! One gRPC connection to Nacos per watched namespace, as a Nacos 2.x client holds it: a server
//! check, the connection's stream with its setup request, then subscriptions and service lists;
//! the server pushes each subscribed service's whole instance list on the stream whenever it
//! changes, and each push is acknowledged there.
//!
//! One connection per namespace because a push does not say its namespace (Nacos' own clients
//! are per namespace, and the setup request names it). The stream's reader never waits for the
//! watch: it leaves pushes in the watch's [`Inbox`], answers the server's liveness checks at
//! once, and reports a connection that ends (or a server that asks for a reset) there too. The
//! unary calls go through a [`Caller`], which is cheap to clone, so that subscriptions and
//! service lists can run side by side and beside the watch.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use mcp_runtime::secret::Secret;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::dto::{ResponseBody, ServerRequest, ServiceInfo, ServiceNames};
use crate::http::Server;
use crate::inbox::Inbox;
use crate::wire::{Payload, Rpc, WireError};

/// What this client calls itself in its setup request.
const CLIENT_VERSION: &str = concat!("mcp-adapter-nacos:v", env!("CARGO_PKG_VERSION"));
/// How often a connection that is not yet set up is asked again whether it is.
const SETUP_POLL: Duration = Duration::from_millis(50);
/// How often each connection's health is asked, as Nacos' own clients do (`keepAliveTime`):
/// the server sends a `ClientDetectionRequest` on a connection it heard nothing on for 20 s and
/// closes it unless the answer comes within 5 s (a client paused that long loses it).
const KEEP_ALIVE: Duration = Duration::from_secs(5);
/// The longest a name lookup of the server may take.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);
/// Unanswered health checks in a row after which the connection counts as lost.
const KEEP_ALIVE_MISSES: u32 = 3;

/// Why a session could not be opened or a request on it failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The connection could not be made or broke.
    #[error("Nacos gRPC at {server}: {message}")]
    Unavailable {
        /// The server's gRPC address.
        server: String,
        /// What happened.
        message: String,
    },
    /// The server refused a request for lack of permission (or of a valid token).
    #[error("Nacos gRPC at {server} refused {call} in namespace {namespace:?}: {message}")]
    Refused {
        /// The server's gRPC address.
        server: String,
        /// The request.
        call: String,
        /// The namespace of the session.
        namespace: String,
        /// The server's message.
        message: String,
    },
    /// The server answered something unusable.
    #[error("Nacos gRPC at {server}: {message}")]
    BadResponse {
        /// The server's gRPC address.
        server: String,
        /// What was wrong.
        message: String,
    },
    /// The TLS files are unusable.
    #[error("Nacos gRPC TLS: {0}")]
    Tls(String),
}

impl From<SessionError> for mcp_core::RegistryError {
    fn from(e: SessionError) -> Self {
        match e {
            SessionError::Refused { .. } => Self::Unauthorized(e.to_string()),
            SessionError::BadResponse { .. } => Self::BadResponse(e.to_string()),
            _ => Self::Unavailable(e.to_string()),
        }
    }
}

/// TLS settings for the gRPC port (the same files as the HTTP client's).
#[derive(Clone, Debug, Default)]
pub struct GrpcTls {
    /// CA bundle (PEM).
    pub ca: Option<std::path::PathBuf>,
    /// Client certificate and key (PEM).
    pub identity: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// An open session: its connection's stream is read, and its health asked, until the session
/// is dropped.
#[derive(Debug)]
pub struct Session {
    caller: Caller,
    reader: JoinHandle<()>,
    keep_alive: Option<JoinHandle<()>>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.reader.abort();
        if let Some(k) = &self.keep_alive {
            k.abort();
        }
    }
}

/// The unary requests of one session (server check, subscriptions, service lists).
#[derive(Clone, Debug)]
pub struct Caller {
    namespace: String,
    server: String,
    rpc: Rpc,
    timeout: Duration,
}

/// How a session connects.
#[derive(Clone, Debug)]
pub struct Connect<'a> {
    /// The server.
    pub server: &'a Server,
    /// TLS files for `https://` servers.
    pub tls: &'a GrpcTls,
    /// Longest one request may take.
    pub timeout: Duration,
    /// Largest message read (a push or an answer).
    pub max_message: usize,
}

impl Session {
    /// Connects for `namespace` and sets the connection up; what the server sends on the
    /// connection's stream goes to `inbox`.
    pub async fn open(
        how: &Connect<'_>,
        namespace: &str,
        inbox: Arc<Inbox>,
    ) -> Result<Self, SessionError> {
        let server = how.server;
        let addr = server.grpc.clone();
        let unavailable = |message: String| SessionError::Unavailable {
            server: addr.clone(),
            message,
        };
        let timeout = how.timeout;
        // Resolved here, with a bound of its own, so that a name lookup that hangs (a
        // container network's DNS under load) is told apart from a server that does not
        // answer; the connection then goes to the address found.
        let lookup = tokio::net::lookup_host((server.host.as_str(), server.grpc_port));
        let resolved = tokio::time::timeout(LOOKUP_TIMEOUT, lookup)
            .await
            .map_err(|_| {
                unavailable(format!(
                    "resolving {} took longer than {LOOKUP_TIMEOUT:?}",
                    server.host
                ))
            })?
            .map_err(|e| unavailable(format!("resolving {}: {e}", server.host)))?
            .next()
            .ok_or_else(|| unavailable(format!("{} resolves to no address", server.host)))?;
        let scheme = if server.tls { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{resolved}"))
            .map_err(|e| unavailable(e.to_string()))?
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            // A server that vanished without closing (a partition, a paused VM) is noticed
            // within 15 s, not at the next TCP timeout.
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true);
        if server.tls {
            endpoint = endpoint
                .tls_config(tls_config(server, how.tls)?)
                .map_err(|e| SessionError::Tls(e.to_string()))?;
        }
        let channel = tokio::time::timeout(timeout, endpoint.connect())
            .await
            .map_err(|_| unavailable(format!("no connection to {resolved} within {timeout:?}")))?
            .map_err(|e| unavailable(mcp_core::clip::error_chain(&e)))?;
        let caller = Caller {
            namespace: namespace.to_string(),
            server: addr.clone(),
            rpc: Rpc::new(channel, how.max_message),
            timeout,
        };
        let check = caller
            .call(Payload::new(
                "ServerCheckRequest",
                &json!({"headers": {}, "module": "internal"}),
                &HashMap::new(),
            ))
            .await?;
        ok(&check, &addr, "ServerCheckRequest", namespace)?;

        // The stream: the setup request first, then acknowledgements from the reader.
        // Unbounded: the reader must never wait to answer (see `read_stream`); what waits here
        // is a few hundred bytes per message the server sent, and a connection that stops
        // taking them is ended by its keep-alive within 15 s.
        let (up_tx, up_rx) = mpsc::unbounded_channel::<Payload>();
        let setup = Payload::new(
            "ConnectionSetupRequest",
            &json!({
                "headers": {},
                "module": "internal",
                "clientVersion": CLIENT_VERSION,
                "tenant": namespace,
                "labels": {"source": "sdk", "module": "naming", "AppName": "mcp-adapter-nacos"},
                "abilityTable": {},
            }),
            &HashMap::new(),
        );
        up_tx
            .send(setup)
            .map_err(|_| unavailable("the stream closed before its setup".into()))?;
        // Not awaited here: a Java gRPC server sends the stream's headers with its first
        // message, which may be the first push.
        let reader = tokio::spawn(read_stream(
            caller.rpc.clone(),
            up_tx,
            up_rx,
            namespace.to_string(),
            Arc::clone(&inbox),
        ));
        let mut session = Self {
            caller,
            reader,
            keep_alive: None,
        };
        session.caller.wait_set_up().await?;
        session.keep_alive = Some(tokio::spawn(keep_alive(session.caller.clone(), inbox)));
        tracing::info!(server = %addr, namespace, "Connected to Nacos.");
        Ok(session)
    }

    /// The session's unary calls.
    pub fn caller(&self) -> &Caller {
        &self.caller
    }
}

impl Caller {
    /// The session's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// One `HealthCheckRequest`: the server's answer.
    async fn health_check(&self) -> Result<ResponseBody, SessionError> {
        let answer = self
            .call(Payload::new(
                "HealthCheckRequest",
                &json!({"headers": {}, "module": "internal"}),
                &HashMap::new(),
            ))
            .await?;
        answer
            .parse("HealthCheckRequest")
            .map_err(|e| bad(&self.server, e))
    }

    /// Asks until the server knows the connection (the setup request is handled apart from the
    /// unary requests, so the first ones may come before it).
    async fn wait_set_up(&self) -> Result<(), SessionError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        loop {
            let body = self.health_check().await?;
            if body.result_code == 200 {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(SessionError::Unavailable {
                    server: self.server.clone(),
                    message: format!(
                        "the connection was not set up within {:?}: {}",
                        self.timeout,
                        body.message.unwrap_or_default()
                    ),
                });
            }
            tokio::time::sleep(SETUP_POLL).await;
        }
    }

    /// Subscribes to `group`/`service`; the answer is its instances now, later changes come
    /// as pushes.
    pub async fn subscribe(
        &self,
        group: &str,
        service: &str,
        token: Option<&Secret>,
    ) -> Result<ServiceInfo, SessionError> {
        let body = self.subscription(group, service, true, token).await?;
        Ok(body
            .service_info
            .unwrap_or_else(|| ServiceInfo::empty(group, service)))
    }

    /// Ends the subscription to `group`/`service` (it left the catalog or a filter).
    pub async fn unsubscribe(
        &self,
        group: &str,
        service: &str,
        token: Option<&Secret>,
    ) -> Result<(), SessionError> {
        self.subscription(group, service, false, token)
            .await
            .map(|_| ())
    }

    /// One page of the names of `group`'s services (`ServiceListRequest`, what
    /// `NamingService.getServicesOfServer` sends: the one listing every Nacos line since 2.0
    /// serves to clients).
    pub async fn list_group(
        &self,
        group: &str,
        page_no: u64,
        page_size: u64,
        token: Option<&Secret>,
    ) -> Result<ServiceNames, SessionError> {
        let call = "ServiceListRequest";
        let answer = self
            .call(Payload::new(
                call,
                &json!({
                    "headers": {},
                    "module": "naming",
                    "namespace": self.namespace,
                    "groupName": group,
                    "serviceName": "",
                    "pageNo": page_no,
                    "pageSize": page_size,
                    "selector": "",
                }),
                &token_header(token),
            ))
            .await?;
        ok(&answer, &self.server, call, &self.namespace)?;
        answer.parse(call).map_err(|e| bad(&self.server, e))
    }

    async fn subscription(
        &self,
        group: &str,
        service: &str,
        subscribe: bool,
        token: Option<&Secret>,
    ) -> Result<ResponseBody, SessionError> {
        let answer = self
            .call(Payload::new(
                "SubscribeServiceRequest",
                &json!({
                    "headers": {},
                    "module": "naming",
                    "namespace": self.namespace,
                    "groupName": group,
                    "serviceName": service,
                    "subscribe": subscribe,
                    "clusters": "",
                }),
                &token_header(token),
            ))
            .await?;
        ok(
            &answer,
            &self.server,
            "SubscribeServiceRequest",
            &self.namespace,
        )
    }

    /// One unary request with a deadline.
    async fn call(&self, payload: Payload) -> Result<Payload, SessionError> {
        let mut rpc = self.rpc.clone();
        request(&mut rpc, &self.server, self.timeout, payload).await
    }
}

/// Asks the connection's health every [`KEEP_ALIVE`] (which keeps it active in the server's
/// eyes); reports it lost after [`KEEP_ALIVE_MISSES`] failed checks in a row (the server no
/// longer knows it, or does not answer).
async fn keep_alive(caller: Caller, inbox: Arc<Inbox>) {
    let mut misses = 0;
    loop {
        tokio::time::sleep(KEEP_ALIVE).await;
        let failure = match caller.health_check().await {
            Ok(body) if body.result_code == 200 => None,
            Ok(body) => Some(format!(
                "health check answered {} ({})",
                body.error_code,
                body.message.unwrap_or_default()
            )),
            Err(e) => Some(e.to_string()),
        };
        let Some(failure) = failure else {
            misses = 0;
            continue;
        };
        misses += 1;
        if misses >= KEEP_ALIVE_MISSES {
            return inbox.lost(
                caller.namespace(),
                format!("{misses} health checks in a row failed, the last: {failure}"),
            );
        }
    }
}

/// The request headers that carry `token`.
fn token_header(token: Option<&Secret>) -> HashMap<String, String> {
    let mut headers = HashMap::new();
    if let Some(t) = token {
        headers.insert("accessToken".to_string(), t.expose().to_string());
    }
    headers
}

/// One unary request with a deadline.
async fn request(
    rpc: &mut Rpc,
    server: &str,
    timeout: Duration,
    payload: Payload,
) -> Result<Payload, SessionError> {
    let call = payload.kind().to_string();
    match tokio::time::timeout(timeout, rpc.request(payload)).await {
        Ok(Ok(p)) => Ok(p),
        Ok(Err(e)) => Err(SessionError::Unavailable {
            server: server.to_string(),
            message: e.to_string(),
        }),
        Err(_) => Err(SessionError::Unavailable {
            server: server.to_string(),
            message: format!("{call}: no answer within {timeout:?}"),
        }),
    }
}

fn bad(server: &str, e: WireError) -> SessionError {
    SessionError::BadResponse {
        server: server.to_string(),
        message: e.to_string(),
    }
}

/// The answer's body when it says success; otherwise the error it names.
fn ok(
    answer: &Payload,
    server: &str,
    call: &str,
    namespace: &str,
) -> Result<ResponseBody, SessionError> {
    let body: ResponseBody = answer.parse(call).map_err(|e| bad(server, e))?;
    if body.result_code == 200 {
        return Ok(body);
    }
    let message = format!(
        "{} (error code {})",
        body.message.clone().unwrap_or_default(),
        body.error_code
    );
    Err(if matches!(body.error_code, 401 | 403) {
        SessionError::Refused {
            server: server.to_string(),
            call: call.to_string(),
            namespace: namespace.to_string(),
            message,
        }
    } else {
        SessionError::BadResponse {
            server: server.to_string(),
            message: format!("{call}: {message}"),
        }
    })
}

fn tls_config(server: &Server, tls: &GrpcTls) -> Result<ClientTlsConfig, SessionError> {
    let read = |p: &std::path::Path| {
        std::fs::read(p).map_err(|e| SessionError::Tls(format!("{}: {e}", p.display())))
    };
    // HTTP/2 without ALPN too: a TLS-terminating proxy in front of Nacos' gRPC port may not
    // negotiate it, and the port speaks nothing else.
    let mut cfg = ClientTlsConfig::new()
        .domain_name(server.host.clone())
        .with_native_roots()
        .assume_http2(true);
    if let Some(ca) = &tls.ca {
        cfg = cfg.ca_certificate(Certificate::from_pem(read(ca)?));
    }
    if let Some((cert, key)) = &tls.identity {
        cfg = cfg.identity(Identity::from_pem(read(cert)?, read(key)?));
    }
    Ok(cfg)
}

/// Reads the connection's stream until it ends: pushes are acknowledged and left in `inbox`,
/// the server's liveness checks answered, a reset request or the stream's end reported there.
/// It never waits for the watch.
async fn read_stream(
    mut rpc: Rpc,
    up_tx: mpsc::UnboundedSender<Payload>,
    up_rx: mpsc::UnboundedReceiver<Payload>,
    namespace: String,
    inbox: Arc<Inbox>,
) {
    let mut stream = match rpc
        .bi_stream(tokio_stream::wrappers::UnboundedReceiverStream::new(up_rx))
        .await
    {
        Ok(s) => s,
        Err(e) => return inbox.lost(&namespace, e.to_string()),
    };
    loop {
        let payload = match stream.message().await {
            Ok(Some(p)) => p,
            Ok(None) => return inbox.lost(&namespace, "the server closed the stream".into()),
            Err(s) => return inbox.lost(&namespace, format!("{:?}: {}", s.code(), s.message())),
        };
        let kind = payload.kind().to_string();
        let request = match ServerRequest::parse(payload.json()) {
            Ok(r) => r,
            Err(e) => {
                // Not even an object: nothing to answer with. A push the server gets no answer
                // to is sent again, and the watch hears of this one.
                inbox.unreadable(
                    &namespace,
                    crate::dto::UnreadablePush {
                        service: None,
                        error: format!("{kind}: the body is not JSON ({e})"),
                    },
                );
                continue;
            }
        };
        let answer = |kind: &str| {
            Payload::new(
                kind,
                &json!({
                    "resultCode": 200,
                    "errorCode": 0,
                    "success": true,
                    "requestId": request.request_id.clone().map_or(Value::Null, Value::String),
                }),
                &HashMap::new(),
            )
        };
        let sent = match kind.as_str() {
            "NotifySubscriberRequest" => {
                // Acknowledged first, readable or not: Nacos resends a push it has no answer
                // to, and an unreadable one would come back forever.
                let sent = up_tx.send(answer("NotifySubscriberResponse"));
                match request.service_info {
                    Some(Ok(info)) => inbox.push(&namespace, info),
                    Some(Err(bad)) => inbox.unreadable(&namespace, bad),
                    None => {}
                }
                sent
            }
            "ClientDetectionRequest" => up_tx.send(answer("ClientDetectionResponse")),
            "ConnectResetRequest" => {
                let _ = up_tx.send(answer("ConnectResetResponse"));
                return inbox.lost(&namespace, "the server asked for a new connection".into());
            }
            other => {
                tracing::debug!(namespace = %namespace, kind = other, "Message from Nacos ignored.");
                Ok(())
            }
        };
        if sent.is_err() {
            return inbox.lost(&namespace, "the stream's sending side closed".into());
        }
    }
}
