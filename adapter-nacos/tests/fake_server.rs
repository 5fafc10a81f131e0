//! adapter-nacos' watch against an in-process fake of a Nacos server, for what no real server
//! does on purpose: a push that cannot be read, and a liveness check that comes while the watch
//! is busy. (Everything else is tested against the real servers: tests/tests/nacos.rs.)
//!
//! The fake's HTTP port answers 2.x's console API (the namespace list and the catalog: `public`
//! holds `orders`); its gRPC port answers the unary requests and lets the test send what it
//! likes on each connection's stream and see what the client answers there.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use adapter_nacos::wire::Payload;
use adapter_nacos::{NacosConfig, NacosRegistry};
use clap::Parser;
use futures::StreamExt;
use mcp_core::{Registry, RegistryEvent};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};
use tonic::codegen::{http, Body, BoxFuture, Context, Poll, Service, StdError};
use tonic::{Request, Response, Status, Streaming};

/// What the fake saw and what the test sends through it.
#[derive(Default)]
struct State {
    /// The stream to the client of each connection, in the order they were opened.
    streams: Mutex<Vec<mpsc::UnboundedSender<Result<Payload, Status>>>>,
    /// What clients sent on their streams (the setup request, then answers).
    answers: Mutex<Vec<Payload>>,
    subscribes: AtomicUsize,
}

fn payload(kind: &str, body: Value) -> Payload {
    Payload::new(kind, &body, &Default::default())
}

fn body(p: &Payload) -> Value {
    serde_json::from_slice(p.json()).unwrap_or(Value::Null)
}

/// The service the fake holds: `orders` in `DEFAULT_GROUP`, one instance.
fn orders(ip: &str) -> Value {
    json!({"name": "DEFAULT_GROUP@@orders", "groupName": "DEFAULT_GROUP", "hosts": [
        {"ip": ip, "port": 8080, "weight": 1.0, "healthy": true, "enabled": true,
         "clusterName": "DEFAULT", "metadata": {}}
    ]})
}

fn answer_to(req: &Payload, state: &State) -> Payload {
    let ok = |kind: &str, mut extra: Value| {
        extra["resultCode"] = json!(200);
        extra["errorCode"] = json!(0);
        payload(kind, extra)
    };
    match req.kind() {
        "ServerCheckRequest" => ok("ServerCheckResponse", json!({"connectionId": "c1"})),
        "HealthCheckRequest" => ok("HealthCheckResponse", json!({})),
        "SubscribeServiceRequest" => {
            state.subscribes.fetch_add(1, Ordering::SeqCst);
            let n = state.subscribes.load(Ordering::SeqCst);
            // Each subscription answer is the list now: a later one has a second instance.
            let mut info = orders("10.0.0.1");
            if n > 1 {
                info["hosts"]
                    .as_array_mut()
                    .expect("hosts")
                    .push(orders("10.0.0.2")["hosts"][0].clone());
            }
            ok("SubscribeServiceResponse", json!({"serviceInfo": info}))
        }
        other => payload(
            "ErrorResponse",
            json!({"resultCode": 500, "errorCode": 501, "message": format!("unknown {other}")}),
        ),
    }
}

/// `/Request/request`.
#[derive(Clone)]
struct UnaryService(Arc<State>);

impl tonic::server::NamedService for UnaryService {
    const NAME: &'static str = "Request";
}

struct Unary(Arc<State>);

impl tonic::server::UnaryService<Payload> for Unary {
    type Response = Payload;
    type Future = BoxFuture<Response<Payload>, Status>;
    fn call(&mut self, req: Request<Payload>) -> Self::Future {
        let answer = answer_to(req.get_ref(), &self.0);
        Box::pin(async move { Ok(Response::new(answer)) })
    }
}

/// The HTTP side of a gRPC service: `$service` (holding the state) answers with tonic's
/// `Grpc::$kind` over `$handler` (the two services differ in nothing else).
macro_rules! grpc_service {
    ($service:ident, $handler:ident, $kind:ident) => {
        impl<B> Service<http::Request<B>> for $service
        where
            B: Body + Send + 'static,
            B::Error: Into<StdError> + Send + 'static,
        {
            type Response = http::Response<tonic::body::Body>;
            type Error = std::convert::Infallible;
            type Future = BoxFuture<Self::Response, Self::Error>;
            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
                Poll::Ready(Ok(()))
            }
            fn call(&mut self, req: http::Request<B>) -> Self::Future {
                let state = Arc::clone(&self.0);
                Box::pin(async move {
                    let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
                    Ok(grpc.$kind($handler(state), req).await)
                })
            }
        }
    };
}

grpc_service!(UnaryService, Unary, unary);

/// `/BiRequestStream/requestBiStream`.
#[derive(Clone)]
struct StreamService(Arc<State>);

impl tonic::server::NamedService for StreamService {
    const NAME: &'static str = "BiRequestStream";
}

struct Bidi(Arc<State>);

impl tonic::server::StreamingService<Payload> for Bidi {
    type Response = Payload;
    type ResponseStream = UnboundedReceiverStream<Result<Payload, Status>>;
    type Future = BoxFuture<Response<Self::ResponseStream>, Status>;
    fn call(&mut self, req: Request<Streaming<Payload>>) -> Self::Future {
        let state = Arc::clone(&self.0);
        Box::pin(async move {
            let (tx, rx) = mpsc::unbounded_channel();
            state.streams.lock().expect("streams").push(tx);
            let mut incoming = req.into_inner();
            tokio::spawn(async move {
                while let Some(Ok(p)) = incoming.next().await {
                    state.answers.lock().expect("answers").push(p);
                }
            });
            Ok(Response::new(UnboundedReceiverStream::new(rx)))
        })
    }
}

grpc_service!(StreamService, Bidi, streaming);

/// An HTTP port below `above` that answers 2.x's console API (404 to anything else), on its own
/// thread.
fn http_console(above: u16) -> SocketAddr {
    let listener = (1..above)
        .rev()
        .find_map(|p| TcpListener::bind(("127.0.0.1", p)).ok())
        .expect("a free port");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for mut conn in listener.incoming().map_while(Result::ok) {
            let mut buf = [0u8; 4096];
            let n = conn.read(&mut buf).unwrap_or(0);
            let request = String::from_utf8_lossy(&buf[..n]);
            let path = request.split_whitespace().nth(1).unwrap_or("");
            let body = if path.starts_with("/nacos/v1/console/namespaces") {
                r#"{"code":200,"data":[{"namespace":"","namespaceShowName":"public"}]}"#
            } else if path.starts_with("/nacos/v1/ns/catalog/services") {
                r#"{"count":1,"serviceList":[{"name":"orders","groupName":"DEFAULT_GROUP"}]}"#
            } else {
                ""
            };
            let status = if body.is_empty() {
                "404 Not Found"
            } else {
                "200 OK"
            };
            let _ = write!(
                conn,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr
}

/// The fake: its state, and the flags that point the adapter at it (its HTTP port, and the
/// distance to its gRPC port, which is wherever the kernel put it).
async fn fake() -> (Arc<State>, Vec<String>) {
    let state = Arc::new(State::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let http = http_console(port);
    let (a, b) = (
        UnaryService(Arc::clone(&state)),
        StreamService(Arc::clone(&state)),
    );
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(a)
            .add_service(b)
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await
    });
    let flags = vec![
        "x".to_string(),
        "--nacos-addr".into(),
        http.to_string(),
        "--grpc-port-offset".into(),
        (port - http.port()).to_string(),
    ];
    (state, flags)
}

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    nacos: NacosConfig,
}

/// The next event of `watch` within 10 s that `pred` picks.
async fn next_matching(
    watch: &mut (impl futures::Stream<Item = Result<RegistryEvent, mcp_core::RegistryError>> + Unpin),
    what: &str,
    pred: impl Fn(&RegistryEvent) -> bool,
) -> RegistryEvent {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let ev = tokio::time::timeout_at(deadline, watch.next())
            .await
            .unwrap_or_else(|_| panic!("no {what} within 10 s"))
            .unwrap_or_else(|| panic!("the watch ended before {what}"))
            .unwrap_or_else(|e| panic!("the watch failed before {what}: {e}"));
        if pred(&ev) {
            return ev;
        }
    }
}

fn metric(registry: &NacosRegistry, name: &str) -> f64 {
    registry
        .collectors()
        .iter()
        .flat_map(|c| c.collect())
        .filter(|f| f.name() == name)
        .flat_map(|f| {
            f.get_metric()
                .iter()
                .map(|m| m.get_counter().get_value())
                .collect::<Vec<_>>()
        })
        .sum()
}

#[tokio::test]
async fn an_unreadable_push_is_acknowledged_reported_and_its_service_read_again() {
    let (state, flags) = fake().await;
    let args = Args::try_parse_from(flags).expect("flags");
    let registry = NacosRegistry::new(&args.nacos).expect("registry");
    let mut watch = registry.watch();
    let reset = next_matching(&mut watch, "the first state", |e| {
        matches!(e, RegistryEvent::Reset(_))
    })
    .await;
    let RegistryEvent::Reset(services) = reset else {
        unreachable!()
    };
    assert_eq!(services.len(), 1);
    assert_eq!(services[0].endpoints.len(), 1);
    assert_eq!(state.subscribes.load(Ordering::SeqCst), 1);

    // A push whose service cannot be read (its hosts are not a list).
    let stream = state.streams.lock().expect("streams")[0].clone();
    let bad = json!({"requestId": "77", "module": "naming",
        "serviceInfo": {"name": "DEFAULT_GROUP@@orders", "groupName": "DEFAULT_GROUP", "hosts": "nope"}});
    stream
        .send(Ok(payload("NotifySubscriberRequest", bad)))
        .expect("send");
    // Reported as a problem naming the service, and the service read again: the new
    // subscription's answer (two instances) is served.
    let problem = next_matching(
        &mut watch,
        "the problem",
        |e| matches!(e, RegistryEvent::Problems { scope, .. } if scope.contains("pushes")),
    )
    .await;
    let RegistryEvent::Problems { scope, problems } = problem else {
        unreachable!()
    };
    assert_eq!(scope, "nacos namespace public pushes");
    assert!(
        problems.len() == 1 && problems[0].contains("DEFAULT_GROUP/orders"),
        "{problems:?}"
    );
    // Then, in either order: the service read again (the new subscription's answer, two
    // instances, is served) and the problem cleared.
    let (mut read_again, mut cleared) = (false, false);
    while !(read_again && cleared) {
        match next_matching(
            &mut watch,
            "the service read again and the problem cleared",
            |_| true,
        )
        .await
        {
            RegistryEvent::Changes { upserts, .. } => {
                read_again |= upserts.iter().any(|u| u.endpoints.len() == 2);
            }
            RegistryEvent::Problems { scope, problems } if scope.contains("pushes") => {
                cleared |= problems.is_empty();
            }
            _ => {}
        }
    }
    assert_eq!(state.subscribes.load(Ordering::SeqCst), 2);
    assert_eq!(
        metric(&registry, "mcp_adapter_registry_unreadable_total"),
        1.0
    );
    // Acknowledged all the same, with its request id.
    let acked = state
        .answers
        .lock()
        .expect("answers")
        .iter()
        .any(|p| p.kind() == "NotifySubscriberResponse" && body(p)["requestId"] == "77");
    assert!(acked, "the unreadable push was acknowledged");
}

#[tokio::test]
async fn a_liveness_check_is_answered_while_nobody_takes_the_pushes() {
    let (state, flags) = fake().await;
    let args = Args::try_parse_from(flags).expect("flags");
    let registry = NacosRegistry::new(&args.nacos).expect("registry");
    let mut watch = registry.watch();
    next_matching(&mut watch, "the first state", |e| {
        matches!(e, RegistryEvent::Reset(_))
    })
    .await;
    // Thousands of pushes of the subscribed service, each a change, and nobody reads the
    // watch's events meanwhile (the core is busy): the connection still answers the server's
    // check at once.
    let stream = state.streams.lock().expect("streams")[0].clone();
    for n in 0..5000 {
        let info = orders(&format!("10.1.{}.{}", n / 250, n % 250));
        stream
            .send(Ok(payload(
                "NotifySubscriberRequest",
                json!({"requestId": format!("p{n}"), "serviceInfo": info}),
            )))
            .expect("send");
    }
    stream
        .send(Ok(payload(
            "ClientDetectionRequest",
            json!({"requestId": "live?"}),
        )))
        .expect("send");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let answered = state
            .answers
            .lock()
            .expect("answers")
            .iter()
            .any(|p| p.kind() == "ClientDetectionResponse" && body(p)["requestId"] == "live?");
        if answered {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no answer to the liveness check within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(watch);
}
