//! The gRPC server's limits over real gRPC, each with small flag values: a stream over a limit
//! ends with RESOURCE_EXHAUSTED (UNAVAILABLE for the connection age) and a message naming the
//! flag, it is counted by limit, and streams within the limits are served as before.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{metric_sum, xds_ack, xds_req, Adapter, SE_V1, STEP};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use mcp_core::registry::RegistryEvent;
use mcp_core::testing::mk_service;
use mcp_runtime::testing::test_args;
use mcp_runtime::CommonArgs;
use mcp_server::conn;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

async fn start(edit: impl FnOnce(&mut CommonArgs)) -> Adapter {
    let mut args = test_args();
    edit(&mut args);
    let a = Adapter::start_with(args).await;
    a.handle.send(RegistryEvent::Reset(vec![
        mk_service("a", 1),
        mk_service("b", 1),
    ]));
    a.wait_readyz(200).await;
    a
}

/// A SotW stream on `channel`, its first request sent; the open stream, or the status it was
/// refused with.
async fn sotw(
    channel: Channel,
    first: DiscoveryRequest,
) -> Result<
    (
        mpsc::UnboundedSender<DiscoveryRequest>,
        Streaming<DiscoveryResponse>,
    ),
    Status,
> {
    let (tx, rx) = mpsc::unbounded_channel();
    tx.send(first).expect("send");
    let mut c = AggregatedDiscoveryServiceClient::new(channel);
    let resp = tokio::time::timeout(
        STEP,
        c.stream_aggregated_resources(UnboundedReceiverStream::new(rx)),
    )
    .await
    .expect("open timed out")?;
    Ok((tx, resp.into_inner()))
}

/// The status a stream ends with, within [`STEP`], skipping responses.
async fn ended<T>(rx: &mut Streaming<T>) -> Status {
    tokio::time::timeout(STEP, async {
        loop {
            match rx.message().await {
                Ok(Some(_)) => {}
                Ok(None) => return Status::ok(""),
                Err(s) => return s,
            }
        }
    })
    .await
    .expect("the stream did not end")
}

fn assert_refused(status: &Status, flag: &str) {
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains(flag), "{status:?}");
}

/// Sum of the samples of metric `name` whose labels include `label` (`limit="streams"`).
async fn sample(a: &Adapter, name: &str, label: &str) -> f64 {
    let text = a.metrics().await;
    let lines: String = text
        .lines()
        .filter(|l| l.contains(label))
        .map(|l| format!("{l}\n"))
        .collect();
    metric_sum(&lines, name)
}

async fn refused(a: &Adapter, limit: &str) -> f64 {
    sample(
        a,
        "mcp_adapter_refused_streams_total",
        &format!("limit=\"{limit}\""),
    )
    .await
}

async fn channel(addr: SocketAddr) -> Channel {
    common::channel_to(addr).await
}

#[tokio::test]
async fn streams_over_max_streams_are_refused_until_one_ends() {
    let a = start(|args| args.server.max_streams = 2).await;
    let ch = channel(a.grpc()).await;
    let (_t1, mut one) = sotw(ch.clone(), xds_req(SE_V1, "")).await.expect("first");
    let (_t2, mut two) = sotw(ch.clone(), xds_req(SE_V1, "")).await.expect("second");
    one.message().await.expect("served").expect("a response");
    two.message().await.expect("served").expect("a response");
    let third = sotw(ch.clone(), xds_req(SE_V1, ""))
        .await
        .expect_err("refused");
    assert_refused(&third, "--max-streams");
    assert!(third.message().contains("at most 2 streams"), "{third:?}");
    assert_eq!(refused(&a, "streams").await, 1.0);
    // One ends: its slot is given back.
    drop((_t1, one));
    let deadline = tokio::time::Instant::now() + STEP;
    let (_t3, mut three) = loop {
        match sotw(ch.clone(), xds_req(SE_V1, "")).await {
            Ok(s) => break s,
            Err(s) => assert_refused(&s, "--max-streams"),
        }
        assert!(tokio::time::Instant::now() < deadline, "no slot came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    three.message().await.expect("served").expect("a response");
    a.stop().await;
}

#[tokio::test]
async fn a_connection_over_max_connections_is_refused_and_closed() {
    let a = start(|args| args.server.max_connections = 1).await;
    let first = channel(a.grpc()).await;
    let (tx, mut ok) = sotw(first.clone(), xds_req(SE_V1, ""))
        .await
        .expect("served");
    let r = ok.message().await.expect("served").expect("a response");
    tx.send(xds_ack(&r)).expect("ack");
    // The second connection goes through a proxy that sees when the adapter closes it.
    let (proxy, dials, ended) = closing_proxy(a.grpc()).await;
    let second = channel(proxy).await;
    let status = sotw(second.clone(), xds_req(SE_V1, ""))
        .await
        .expect_err("refused");
    assert_refused(&status, "--max-connections");
    assert_eq!(refused(&a, "connections").await, 1.0);
    // The first connection's stream is unaffected.
    a.handle.send(RegistryEvent::Upsert(mk_service("c", 1)));
    let r = ok.message().await.expect("served").expect("the change");
    assert_eq!(r.resources.len(), 3);
    // The refused connection is closed by the adapter within its over-limit life.
    let deadline = tokio::time::Instant::now() + conn::OVER_LIMIT_LIFE + STEP;
    while ended.load(Ordering::SeqCst) != 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the refused connection is still open"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(dials.load(Ordering::SeqCst), 1);
    // The channel connects again for its next stream, which is refused again.
    let again = sotw(second.clone(), xds_req(SE_V1, ""))
        .await
        .expect_err("refused");
    assert_eq!(again.code(), Code::ResourceExhausted, "{again:?}");
    assert_eq!(dials.load(Ordering::SeqCst), 2, "a new connection");
    assert_eq!(refused(&a, "connections").await, 2.0);
    a.stop().await;
}

/// The HTTP/2 limit makes a client wait for a free stream instead of failing it.
#[tokio::test]
async fn streams_per_connection_wait_for_a_free_one() {
    let a = start(|args| args.server.max_streams_per_connection = 2).await;
    let ch = channel(a.grpc()).await;
    let (_t1, one) = sotw(ch.clone(), xds_req(SE_V1, "")).await.expect("first");
    let (_t2, _two) = sotw(ch.clone(), xds_req(SE_V1, "")).await.expect("second");
    let third = tokio::spawn(sotw(ch.clone(), xds_req(SE_V1, "")));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!third.is_finished(), "the third waits for a free stream");
    assert_eq!(
        metric_sum(&a.metrics().await, "mcp_adapter_connected_sinks"),
        2.0
    );
    drop((_t1, one));
    let (_t3, mut three) = tokio::time::timeout(STEP, third)
        .await
        .expect("the third started")
        .expect("task")
        .expect("served");
    three.message().await.expect("served").expect("a response");
    a.stop().await;
}

#[tokio::test]
async fn type_urls_types_and_names_over_their_limits_end_the_stream() {
    let a = start(|args| {
        args.server.max_type_url_length = 64;
        args.server.max_types_per_stream = 3;
        args.server.max_resource_names = 4;
    })
    .await;
    let ch = channel(a.grpc()).await;

    let long = format!("type.googleapis.com/{}", "x".repeat(60));
    let (_t, mut s) = sotw(ch.clone(), xds_req(&long, "")).await.expect("opens");
    let status = ended(&mut s).await;
    assert_refused(&status, "--max-type-url-length");
    assert!(status.message().contains("80 bytes"), "{status:?}");

    // Three types are served (one of them ServiceEntries); a fourth ends the stream.
    let (tx, mut s) = sotw(ch.clone(), xds_req(SE_V1, "")).await.expect("opens");
    let r = s.message().await.expect("ok").expect("ServiceEntries");
    assert_eq!(r.resources.len(), 2);
    tx.send(xds_ack(&r)).expect("ack");
    for t in ["example.com/A", "example.com/B"] {
        tx.send(xds_req(t, "")).expect("send");
        let r = s.message().await.expect("ok").expect("empty answer");
        assert_eq!((r.type_url.as_str(), r.resources.len()), (t, 0));
    }
    tx.send(xds_req("example.com/C", "")).expect("send");
    assert_refused(&ended(&mut s).await, "--max-types-per-stream");

    // SotW resource names over the limit.
    let mut req = xds_req(SE_V1, "");
    req.resource_names = (0..5).map(|i| format!("ns/{i}")).collect();
    let (_t, mut s) = sotw(ch.clone(), req).await.expect("opens");
    assert_refused(&ended(&mut s).await, "--max-resource-names");

    // Delta: names subscribed over several requests add up; declared versions count too.
    let (dtx, drx) = mpsc::unbounded_channel();
    let mut c = AggregatedDiscoveryServiceClient::new(ch.clone());
    dtx.send(DeltaDiscoveryRequest {
        type_url: SE_V1.into(),
        resource_names_subscribe: vec!["test/a".into(), "test/b".into()],
        ..Default::default()
    })
    .expect("send");
    let mut d: Streaming<DeltaDiscoveryResponse> = c
        .delta_aggregated_resources(UnboundedReceiverStream::new(drx))
        .await
        .expect("opens")
        .into_inner();
    let r = d.message().await.expect("ok").expect("two names");
    dtx.send(DeltaDiscoveryRequest {
        type_url: SE_V1.into(),
        response_nonce: r.nonce,
        resource_names_subscribe: vec!["test/c".into(), "test/d".into()],
        ..Default::default()
    })
    .expect("send");
    d.message().await.expect("ok").expect("c and d");
    dtx.send(DeltaDiscoveryRequest {
        type_url: SE_V1.into(),
        resource_names_subscribe: vec!["test/e".into()],
        ..Default::default()
    })
    .expect("send");
    let status = ended(&mut d).await;
    assert_refused(&status, "--max-resource-names");
    assert!(status.message().contains("5 resource names"), "{status:?}");

    let (dtx, drx) = mpsc::unbounded_channel();
    dtx.send(DeltaDiscoveryRequest {
        type_url: SE_V1.into(),
        initial_resource_versions: (0..5).map(|i| (format!("ns/{i}"), "v".into())).collect(),
        ..Default::default()
    })
    .expect("send");
    let mut d = c
        .delta_aggregated_resources(UnboundedReceiverStream::new(drx))
        .await
        .expect("opens")
        .into_inner();
    assert_refused(&ended(&mut d).await, "--max-resource-names");

    assert_eq!(refused(&a, "type_url_length").await, 1.0);
    assert_eq!(refused(&a, "types_per_stream").await, 1.0);
    assert_eq!(refused(&a, "resource_names").await, 3.0);
    a.stop().await;
}

#[tokio::test]
async fn a_request_over_max_request_size_ends_the_stream() {
    let a = start(|args| args.server.max_request_size = 4096).await;
    let mut req = xds_req(SE_V1, "");
    req.resource_names = (0..400).map(|i| format!("ns/name-{i:04}")).collect();
    let ch = channel(a.grpc()).await;
    let status = match sotw(ch, req).await {
        Ok((_t, mut s)) => ended(&mut s).await,
        Err(s) => s,
    };
    assert_refused(&status, "--max-request-size");
    assert!(status.message().contains("4096 bytes"), "{status:?}");
    assert_eq!(refused(&a, "request_size").await, 1.0);
    a.stop().await;
}

/// A TCP proxy in front of `to` that counts the connections made through it.
async fn counting_proxy(to: SocketAddr) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let count = Arc::new(AtomicUsize::new(0));
    let counted = count.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                if let Ok(mut server) = tokio::net::TcpStream::connect(to).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    (addr, count)
}

/// `--max-connection-age`: the stream ends with UNAVAILABLE naming the flag once the age and
/// the grace have passed, and the client's next stream goes over a new connection (the old one
/// was told to go away).
#[tokio::test]
async fn old_connections_are_recycled() {
    let a = start(|args| {
        args.server.max_connection_age = Duration::from_secs(1);
        args.server.max_connection_age_grace = Duration::from_secs(1);
    })
    .await;
    let (proxy, dials) = counting_proxy(a.grpc()).await;
    let ch = channel(proxy).await;
    let started = tokio::time::Instant::now();
    let (_t, mut s) = sotw(ch.clone(), xds_req(SE_V1, "")).await.expect("opens");
    let status = ended(&mut s).await;
    let lived = started.elapsed();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("--max-connection-age"),
        "{status:?}"
    );
    assert!(
        lived >= Duration::from_millis(1900),
        "age + grace: {lived:?}"
    );
    assert_eq!(dials.load(Ordering::SeqCst), 1);
    let (_t, mut s) = sotw(ch.clone(), xds_req(SE_V1, ""))
        .await
        .expect("opens again");
    s.message().await.expect("served").expect("the set");
    assert_eq!(dials.load(Ordering::SeqCst), 2, "a new connection");
    a.stop().await;
}

/// A stream counts in `mcp_adapter_unacked_responses` while its oldest unacknowledged response
/// is older than `--unacked-threshold`, and stops counting once it is acknowledged.
#[tokio::test]
async fn unacknowledged_responses_are_counted_after_the_threshold() {
    let a = start(|args| args.server.unacked_threshold = Duration::from_millis(500)).await;
    let unacked = || sample(&a, "mcp_adapter_unacked_responses", "protocol=\"xds\"");
    let ch = channel(a.grpc()).await;
    let (tx, mut s) = sotw(ch, xds_req(SE_V1, "")).await.expect("opens");
    let r = s.message().await.expect("ok").expect("the set");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(unacked().await, 0.0, "not yet");
    let deadline = tokio::time::Instant::now() + STEP;
    while unacked().await != 1.0 {
        assert!(tokio::time::Instant::now() < deadline, "not counted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tx.send(xds_ack(&r)).expect("ack");
    let deadline = tokio::time::Instant::now() + STEP;
    while unacked().await != 0.0 {
        assert!(tokio::time::Instant::now() < deadline, "still counted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(tx);
    a.stop().await;
}

// #33: long names, node ids and a stream's bytes.

/// Waits up to `within` until `probe` gives `want`.
async fn wait_value<F, Fut>(within: Duration, what: &str, want: f64, mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = f64>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let got = probe().await;
        if got == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: {got}, not {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// With the default limits: a 1 MiB resource name, a 1 MiB node id and a 1 MiB declared
/// version each end their stream with RESOURCE_EXHAUSTED naming the flag; delta subscriptions
/// of names under the length limit add up in bytes across requests until `--max-stream-bytes`
/// (16 MiB) ends the stream; a NACK with a 1 MiB detail is counted and the stream goes on.
#[tokio::test]
async fn long_names_node_ids_and_stream_bytes_over_their_limits_end_the_stream() {
    let a = start(|_| {}).await;
    let ch = channel(a.grpc()).await;
    let huge = "n".repeat(1 << 20);

    let mut req = xds_req(SE_V1, "");
    req.resource_names = vec![format!("ns/{huge}")];
    let (_t, mut s) = sotw(ch.clone(), req).await.expect("opens");
    let status = ended(&mut s).await;
    assert_refused(&status, "--max-resource-name-length");

    let mut req = xds_req(SE_V1, "");
    req.node = Some(envoy_types::pb::envoy::config::core::v3::Node {
        id: huge.clone(),
        ..Default::default()
    });
    let (_t, mut s) = sotw(ch.clone(), req).await.expect("opens");
    assert_refused(&ended(&mut s).await, "--max-node-id-length");

    // The first batch's answer reports its 9,000 names removed (none exists): 9 MB.
    let mut c =
        AggregatedDiscoveryServiceClient::new(ch.clone()).max_decoding_message_size(64 << 20);
    let (dtx, drx) = mpsc::unbounded_channel();
    dtx.send(DeltaDiscoveryRequest {
        type_url: SE_V1.into(),
        initial_resource_versions: [("test/a".to_string(), huge.clone())].into(),
        ..Default::default()
    })
    .expect("send");
    let mut d = c
        .delta_aggregated_resources(UnboundedReceiverStream::new(drx))
        .await
        .expect("opens")
        .into_inner();
    assert_refused(&ended(&mut d).await, "--max-resource-name-length");

    // Two requests of 9,000 names of 1,000 bytes: 9 MB each is within every other limit.
    let names = |batch: usize| -> Vec<String> {
        (0..9000)
            .map(|i| format!("ns/{batch}-{i:05}-{}", "x".repeat(990)))
            .collect()
    };
    let (dtx, drx) = mpsc::unbounded_channel();
    dtx.send(DeltaDiscoveryRequest {
        type_url: SE_V1.into(),
        resource_names_subscribe: names(0),
        ..Default::default()
    })
    .expect("send");
    let mut d = c
        .delta_aggregated_resources(UnboundedReceiverStream::new(drx))
        .await
        .expect("opens")
        .into_inner();
    let r = d.message().await.expect("ok").expect("the first batch");
    dtx.send(DeltaDiscoveryRequest {
        type_url: SE_V1.into(),
        response_nonce: r.nonce,
        resource_names_subscribe: names(1),
        ..Default::default()
    })
    .expect("send");
    let status = ended(&mut d).await;
    assert_refused(&status, "--max-stream-bytes");

    // A NACK of any length is counted, and the stream goes on.
    let (tx, mut s) = sotw(ch.clone(), xds_req(SE_V1, "")).await.expect("opens");
    let r = s.message().await.expect("ok").expect("the set");
    let mut nack = xds_ack(&r);
    nack.error_detail = Some(envoy_types::pb::google::rpc::Status {
        code: 3,
        message: huge.clone(),
        ..Default::default()
    });
    tx.send(nack).expect("nack");
    wait_value(STEP, "NACKs counted", 1.0, || {
        sample(&a, "mcp_adapter_nacks_total", "protocol=\"xds\"")
    })
    .await;
    tx.send(xds_req("example.com/A", "")).expect("send");
    let r = s.message().await.expect("ok").expect("still served");
    assert_eq!(r.type_url, "example.com/A");

    assert_eq!(refused(&a, "resource_name_length").await, 2.0);
    assert_eq!(refused(&a, "node_id_length").await, 1.0);
    assert_eq!(refused(&a, "stream_bytes").await, 1.0);
    a.stop().await;
}

// #33: a sink that stops reading.

/// A channel whose streams offer the server a 16-byte receive window: a stream whose responses
/// are never read keeps it closed.
async fn closed_window_channel(addr: SocketAddr) -> Channel {
    tokio::time::timeout(
        STEP,
        Channel::from_shared(format!("http://{addr}"))
            .expect("url")
            .initial_stream_window_size(Some(16))
            .connect(),
    )
    .await
    .expect("connect timed out")
    .expect("connect")
}

/// A SotW sink that asks for four types and ACKs the first two nonces (the server numbers them
/// 1, 2, ...) without reading a byte: the server has more to send than the window, the
/// response body and its one-slot channel take, so the stream's task waits to hand one over.
async fn stuck_sink(
    addr: SocketAddr,
) -> (
    mpsc::UnboundedSender<DiscoveryRequest>,
    Streaming<DiscoveryResponse>,
) {
    let ch = closed_window_channel(addr).await;
    let (tx, s) = sotw(ch, xds_req(SE_V1, "")).await.expect("opens");
    for t in ["example.com/A", "example.com/B", "example.com/C"] {
        tx.send(xds_req(t, "")).expect("send");
    }
    let mut ack = xds_req(SE_V1, "1");
    tx.send(ack.clone()).expect("ack");
    ack.type_url = "example.com/A".into();
    ack.response_nonce = "2".into();
    tx.send(ack).expect("ack");
    (tx, s)
}

/// A stream stuck handing a response to a sink that stopped reading counts in
/// `mcp_adapter_unacked_responses` once its oldest response is older than the threshold.
#[tokio::test]
async fn a_sink_that_stops_reading_counts_as_unacked() {
    let a = start(|args| args.server.unacked_threshold = Duration::from_secs(1)).await;
    let unacked = || sample(&a, "mcp_adapter_unacked_responses", "protocol=\"xds\"");
    let (_tx, _s) = stuck_sink(a.grpc()).await;
    wait_value(STEP, "the stuck stream counted", 1.0, unacked).await;
    // The adapter's shutdown waits for its connections to close, and this one's stream is
    // never finished: the sink leaves first.
    drop((_tx, _s));
    a.stop().await;
}

/// `--max-connection-age 1s` (grace 1s): a stream stuck handing a response to a sink that
/// stopped reading ends when the age and the grace have passed, and its slot under
/// `--max-streams 1` serves a new sink.
#[tokio::test]
async fn a_sink_that_stops_reading_gives_its_slot_back_at_max_connection_age() {
    let a = start(|args| {
        args.server.max_streams = 1;
        args.server.max_connection_age = Duration::from_secs(1);
        args.server.max_connection_age_grace = Duration::from_secs(1);
    })
    .await;
    let started = tokio::time::Instant::now();
    let (tx, stuck) = stuck_sink(a.grpc()).await;
    let open = || sample(&a, "mcp_adapter_connected_sinks", "protocol=\"xds\"");
    wait_value(STEP, "the stuck stream open", 1.0, open).await;
    wait_value(2 * STEP, "the stuck stream ended", 0.0, open).await;
    let freed = started.elapsed();
    eprintln!("the slot was free after {freed:?}");
    // Age and grace (2 s), not the 5 s a farewell to a full channel would wait on top.
    assert!(freed < Duration::from_secs(5), "{freed:?}");
    let ch = channel(a.grpc()).await;
    let (_t, mut s) = sotw(ch, xds_req(SE_V1, "")).await.expect("opens");
    let r = s.message().await.expect("served").expect("the set");
    assert_eq!(r.resources.len(), 2);
    drop((tx, stuck));
    a.stop().await;
}

/// A TCP proxy in front of `to` that counts the connections made through it and those that
/// ended (both sides closed: the client saw the server's close).
async fn closing_proxy(to: SocketAddr) -> (SocketAddr, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (dials, ended) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (d, e) = (dials.clone(), ended.clone());
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            d.fetch_add(1, Ordering::SeqCst);
            let e = e.clone();
            tokio::spawn(async move {
                if let Ok(mut server) = tokio::net::TcpStream::connect(to).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
                e.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    (addr, dials, ended)
}

/// `--idle-connection-timeout` (#33): a connection that opens no stream is closed and counted;
/// once the client has seen the close, its channel reconnects for its next stream, which is
/// served. (A stream the client opens in the instant of the close fails: the close is not a
/// GOAWAY, see `mcp_server::conn`.)
#[tokio::test]
async fn an_idle_connection_is_closed_and_the_client_reconnects() {
    let a = start(|args| args.server.idle_connection_timeout = Duration::from_millis(300)).await;
    let (proxy, dials, ended) = closing_proxy(a.grpc()).await;
    let ch = channel(proxy).await;
    let deadline = tokio::time::Instant::now() + STEP;
    while ended.load(Ordering::SeqCst) != 1 {
        assert!(tokio::time::Instant::now() < deadline, "not closed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        sample(
            &a,
            "mcp_adapter_refused_connections_total",
            "limit=\"idle_connection_timeout\"",
        )
        .await,
        1.0
    );
    let (_t, mut s) = sotw(ch.clone(), xds_req(SE_V1, "")).await.expect("opens");
    s.message().await.expect("served").expect("the set");
    assert_eq!(dials.load(Ordering::SeqCst), 2, "a new connection");
    a.stop().await;
}

/// `--max-connection-age 1s` (grace 1s): the connection of a sink that stopped reading is
/// closed `conn::AGE_CLOSE_AFTER` after its stream ended, whatever the peer does: its place
/// under `--max-connections 1` serves a new sink, and the adapter's shutdown does not wait for
/// the stuck peer.
#[tokio::test]
async fn a_sink_that_stops_reading_loses_its_connection_after_the_age_and_grace() {
    let a = start(|args| {
        args.server.max_connections = 1;
        args.server.max_connection_age = Duration::from_secs(1);
        args.server.max_connection_age_grace = Duration::from_secs(1);
    })
    .await;
    let started = tokio::time::Instant::now();
    let (tx, stuck) = stuck_sink(a.grpc()).await;
    let served = || sample(&a, "mcp_adapter_connections", "state=\"served\"");
    wait_value(STEP, "its connection counted", 1.0, served).await;
    let by = STEP + Duration::from_secs(2) + conn::AGE_CLOSE_AFTER;
    wait_value(by, "its connection closed", 0.0, served).await;
    let closed = started.elapsed();
    eprintln!("the stuck connection was closed after {closed:?}");
    assert!(
        closed >= Duration::from_secs(2) + conn::AGE_CLOSE_AFTER,
        "not before the age, its grace and the margin: {closed:?}"
    );
    let ch = channel(a.grpc()).await;
    let (_t, mut s) = sotw(ch, xds_req(SE_V1, "")).await.expect("opens");
    let r = s.message().await.expect("served").expect("the set");
    assert_eq!(r.resources.len(), 2);
    drop((_t, s));
    tokio::time::timeout(STEP, a.stop())
        .await
        .expect("the shutdown does not wait for the stuck peer");
    drop((tx, stuck));
}
