//! One gRPC connection to Nacos per watched namespace, as a Nacos 2.x client holds it: a server
//! check, the connection's stream with its setup request, then subscriptions; the server
//! pushes each subscribed service's whole instance list on the stream whenever it changes, and
//! each push is acknowledged there.
//!
//! One connection per namespace because a push does not say its namespace (Nacos' own clients
//! are per namespace, and the setup request names it). A connection that ends, or a server
//! that asks for a reset, is reported as [`SessionEvent::Lost`]: the watch ends and the core
//! keeps the last good state until a new watch has read everything again.

use std::collections::HashMap;
use std::time::Duration;

use mcp_runtime::secret::Secret;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::dto::{ResponseBody, ServerRequest, ServiceInfo};
use crate::http::Server;
use crate::wire::{Payload, Rpc, WireError};

/// What this client calls itself in its setup request.
const CLIENT_VERSION: &str = concat!("mcp-adapter-nacos:v", env!("CARGO_PKG_VERSION"));
/// How often a connection that is not yet set up is asked again whether it is.
const SETUP_POLL: Duration = Duration::from_millis(50);

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

/// What a session tells the watch.
#[derive(Debug)]
pub enum SessionEvent {
    /// A subscribed service's instances, as pushed.
    Push {
        /// The session's namespace.
        namespace: String,
        /// The service.
        info: ServiceInfo,
    },
    /// The connection ended.
    Lost {
        /// The session's namespace.
        namespace: String,
        /// Why.
        reason: String,
    },
}

/// TLS settings for the gRPC port (the same files as the HTTP client's).
#[derive(Clone, Debug, Default)]
pub struct GrpcTls {
    /// CA bundle (PEM).
    pub ca: Option<std::path::PathBuf>,
    /// Client certificate and key (PEM).
    pub identity: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// An open session.
#[derive(Debug)]
pub struct Session {
    namespace: String,
    server: String,
    rpc: Rpc,
    timeout: Duration,
    reader: JoinHandle<()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Session {
    /// Connects to `server` for `namespace` and sets the connection up; pushes and the
    /// connection's end go to `events`.
    pub async fn open(
        server: &Server,
        tls: &GrpcTls,
        namespace: &str,
        timeout: Duration,
        events: mpsc::Sender<SessionEvent>,
    ) -> Result<Self, SessionError> {
        let addr = server.grpc.clone();
        let unavailable = |message: String| SessionError::Unavailable {
            server: addr.clone(),
            message,
        };
        let mut endpoint = Endpoint::from_shared(server.grpc.clone())
            .map_err(|e| unavailable(e.to_string()))?
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            // A server that vanished without closing (a partition, a paused VM) is noticed
            // within 15 s, not at the next TCP timeout.
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true);
        if server.tls {
            endpoint = endpoint
                .tls_config(tls_config(server, tls)?)
                .map_err(|e| SessionError::Tls(e.to_string()))?;
        }
        let channel = tokio::time::timeout(timeout, endpoint.connect())
            .await
            .map_err(|_| unavailable(format!("no connection within {timeout:?}")))?
            .map_err(|e| unavailable(mcp_core::clip::error_chain(&e)))?;
        let mut rpc = Rpc::new(channel);

        let check = request(
            &mut rpc,
            &addr,
            timeout,
            Payload::new(
                "ServerCheckRequest",
                &json!({"headers": {}, "module": "internal"}),
                &HashMap::new(),
            ),
        )
        .await?;
        ok(&check, &addr, "ServerCheckRequest", namespace)?;

        // The stream: the setup request first, then acknowledgements from the reader.
        let (up_tx, up_rx) = mpsc::channel::<Payload>(64);
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
            .await
            .map_err(|_| unavailable("the stream closed before its setup".into()))?;
        // Not awaited here: a Java gRPC server sends the stream's headers with its first
        // message, which may be the first push.
        let reader = tokio::spawn(read_stream(
            rpc.clone(),
            up_tx,
            up_rx,
            namespace.to_string(),
            events,
        ));
        let mut session = Self {
            namespace: namespace.to_string(),
            server: addr.clone(),
            rpc,
            timeout,
            reader,
        };
        session.wait_set_up().await?;
        tracing::info!(server = %addr, namespace, "Connected to Nacos.");
        Ok(session)
    }

    /// Asks until the server knows the connection (the setup request is handled apart from the
    /// unary requests, so the first ones may come before it).
    async fn wait_set_up(&mut self) -> Result<(), SessionError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        loop {
            let answer = request(
                &mut self.rpc,
                &self.server,
                self.timeout,
                Payload::new(
                    "HealthCheckRequest",
                    &json!({"headers": {}, "module": "internal"}),
                    &HashMap::new(),
                ),
            )
            .await?;
            let body: ResponseBody = answer
                .parse("HealthCheckRequest")
                .map_err(|e| bad(&self.server, e))?;
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
        &mut self,
        group: &str,
        service: &str,
        token: Option<&Secret>,
    ) -> Result<ServiceInfo, SessionError> {
        let body = self.subscription(group, service, true, token).await?;
        Ok(body.service_info.unwrap_or_else(|| ServiceInfo {
            name: Some(service.to_string()),
            group_name: Some(group.to_string()),
            hosts: Vec::new(),
        }))
    }

    /// Ends the subscription to `group`/`service` (it left the catalog or a filter).
    pub async fn unsubscribe(
        &mut self,
        group: &str,
        service: &str,
        token: Option<&Secret>,
    ) -> Result<(), SessionError> {
        self.subscription(group, service, false, token)
            .await
            .map(|_| ())
    }

    async fn subscription(
        &mut self,
        group: &str,
        service: &str,
        subscribe: bool,
        token: Option<&Secret>,
    ) -> Result<ResponseBody, SessionError> {
        let mut headers = HashMap::new();
        if let Some(t) = token {
            headers.insert("accessToken".to_string(), t.expose().to_string());
        }
        let answer = request(
            &mut self.rpc,
            &self.server,
            self.timeout,
            Payload::new(
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
                &headers,
            ),
        )
        .await?;
        ok(
            &answer,
            &self.server,
            "SubscribeServiceRequest",
            &self.namespace,
        )
    }
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

/// Reads the connection's stream until it ends: pushes are acknowledged and passed on, the
/// server's liveness checks answered, a reset request ends the session.
async fn read_stream(
    mut rpc: Rpc,
    up_tx: mpsc::Sender<Payload>,
    up_rx: mpsc::Receiver<Payload>,
    namespace: String,
    events: mpsc::Sender<SessionEvent>,
) {
    let lost = |reason: String| SessionEvent::Lost {
        namespace: namespace.clone(),
        reason,
    };
    let mut stream = match rpc
        .bi_stream(tokio_stream::wrappers::ReceiverStream::new(up_rx))
        .await
    {
        Ok(s) => s,
        Err(e) => {
            let _ = events.send(lost(e.to_string())).await;
            return;
        }
    };
    loop {
        let payload = match stream.message().await {
            Ok(Some(p)) => p,
            Ok(None) => {
                let _ = events
                    .send(lost("the server closed the stream".into()))
                    .await;
                return;
            }
            Err(s) => {
                let _ = events
                    .send(lost(format!("{:?}: {}", s.code(), s.message())))
                    .await;
                return;
            }
        };
        let kind = payload.kind().to_string();
        let request: ServerRequest = match payload.parse(&kind) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(namespace = %namespace, error = %e, "Unreadable message from Nacos; ignored.");
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
        match kind.as_str() {
            "NotifySubscriberRequest" => {
                // Acknowledged first: Nacos resends a push it has no answer to.
                if up_tx
                    .send(answer("NotifySubscriberResponse"))
                    .await
                    .is_err()
                {
                    return;
                }
                if let Some(info) = request.service_info {
                    let push = SessionEvent::Push {
                        namespace: namespace.clone(),
                        info,
                    };
                    if events.send(push).await.is_err() {
                        return;
                    }
                }
            }
            "ClientDetectionRequest" => {
                if up_tx.send(answer("ClientDetectionResponse")).await.is_err() {
                    return;
                }
            }
            "ConnectResetRequest" => {
                let _ = up_tx.send(answer("ConnectResetResponse")).await;
                let _ = events
                    .send(lost("the server asked for a new connection".into()))
                    .await;
                return;
            }
            other => {
                tracing::debug!(namespace = %namespace, kind = other, "Message from Nacos ignored.");
            }
        }
    }
}
