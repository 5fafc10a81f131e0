//! Change-to-sink latency on a real ZooKeeper: a Dubbo provider appears or disappears, how long
//! until an xDS sink holds the new endpoint set (1,000 providers over 100 interfaces). The floor,
//! measured in the same run, is ZooKeeper's own child watch firing after the same write: once
//! with writes back to back (as first measured), and once on the adapter's own writes, which
//! are 50 ms apart. On a 2-core machine the watch fired later after such a gap than back to
//! back (paced like the adapter's, the first floor's p50 went from ~2.3 to ~3.4 ms), so only
//! the second compares like with like.
//!
//! Two sinks, one after the other: mcpctl's (decodes and copies every ServiceEntry of every
//! SotW response, as a full client does) and a light one that decodes only the watched
//! interface's ServiceEntry, so that its ratio is the adapter's and not the sink's.
//!
//!     cargo build --release -p adapter-zookeeper -p mcpctl && \
//!       cargo bench -p e2e --bench zookeeper_latency
//!
//! (needs Debian's zookeeper: scripts/install-zookeeper.sh).

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use prost::Message;
use proto::istio::mcp::v1alpha1::Resource;
use proto::istio::networking::v1alpha3::ServiceEntry;
use tokio_stream::wrappers::UnboundedReceiverStream;

use e2e::zookeeper::{provider_path, Writer, ZooKeeper};
use e2e::Adapter;
use hdrhistogram::Histogram;
use latency::{histogram, p50_p99_ratios, print_quantiles, record};
use mcpctl::sink::{Sink, SinkOptions};

mod latency;
mod smoke;

/// Changes per phase (2 in a smoke run).
fn round_count() -> usize {
    smoke::scaled(200, 2)
}
/// Interfaces with 10 providers each (interface 42 is the one that changes; 43 in a smoke run).
fn interfaces() -> usize {
    smoke::scaled(100, 43)
}

fn iface(i: usize) -> String {
    format!("com.example.svc{i:03}")
}

fn url(ip: &str, iface: &str) -> String {
    format!(
        "dubbo://{ip}:20880/{iface}?application=demo&interface={iface}&side=provider&dubbo=2.0.2"
    )
}

fn report(what: &str, h: &Histogram<u64>) {
    print_quantiles(46, what, h);
}

fn endpoints(u: &mcpctl::sink::Update, iface: &str) -> usize {
    u.state
        .values()
        .find(|r| r.spec.hosts.iter().any(|h| h.starts_with(iface)))
        .map_or(0, |r| r.spec.endpoints.len())
}

/// A SotW sink that does no more than seeing the change needs: it decodes each response's
/// resource envelopes for their names and only the watched interface's ServiceEntry. mcpctl's sink
/// decodes and copies every ServiceEntry of every response (what a full client does), which on
/// these 2 cores is most of the time after the adapter has pushed; this one measures the adapter.
struct LightSink {
    tx: tokio::sync::mpsc::UnboundedSender<DiscoveryRequest>,
    rx: tonic::Streaming<DiscoveryResponse>,
    /// `namespace/name` of the watched interface's resource.
    name: String,
}

const SE_TYPE: &str = "networking.istio.io/v1/ServiceEntry";

impl LightSink {
    async fn connect(grpc: SocketAddr, iface: &str) -> LightSink {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect");
        let mut client =
            AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(usize::MAX);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tx.send(DiscoveryRequest {
            type_url: SE_TYPE.into(),
            ..Default::default()
        })
        .expect("subscribe");
        let rx = client
            .stream_aggregated_resources(UnboundedReceiverStream::new(rx))
            .await
            .expect("stream")
            .into_inner();
        let mut sink = LightSink {
            tx,
            rx,
            name: String::new(),
        };
        // The first response: find the interface's resource by its hosts, once.
        let first = sink.next().await;
        sink.name = first
            .iter()
            .filter_map(|r| {
                let body = r.body.as_ref()?;
                let se = ServiceEntry::decode(body.value.as_slice()).ok()?;
                se.hosts
                    .iter()
                    .any(|h| h.starts_with(iface))
                    .then(|| r.metadata.as_ref().map(|m| m.name.clone()))
                    .flatten()
            })
            .next()
            .expect("the interface is served");
        sink
    }

    /// The next response, ACKed, as MCP resources (bodies not decoded).
    async fn next(&mut self) -> Vec<Resource> {
        let resp = self
            .rx
            .message()
            .await
            .expect("stream ok")
            .expect("stream open");
        self.tx
            .send(DiscoveryRequest {
                type_url: SE_TYPE.into(),
                version_info: resp.version_info.clone(),
                response_nonce: resp.nonce.clone(),
                ..Default::default()
            })
            .expect("ack");
        resp.resources
            .iter()
            .map(|any| Resource::decode(any.value.as_slice()).expect("MCP Resource"))
            .collect()
    }

    /// Endpoints of the watched interface in the next response.
    async fn endpoints(&mut self) -> usize {
        let resources = self.next().await;
        resources
            .iter()
            .find(|r| r.metadata.as_ref().is_some_and(|m| m.name == self.name))
            .and_then(|r| r.body.as_ref())
            .map_or(0, |b| {
                ServiceEntry::decode(b.value.as_slice())
                    .expect("ServiceEntry")
                    .endpoints
                    .len()
            })
    }
}

/// The sink a round waits on.
#[allow(clippy::large_enum_variant)] // one of each, on the stack
enum Watching {
    Mcpctl(Sink),
    Light(LightSink),
}

impl Watching {
    /// Waits until the sink holds `want` endpoints for `iface`.
    async fn until(&mut self, iface: &str, want: usize) {
        loop {
            let got = match self {
                Watching::Mcpctl(sink) => endpoints(&sink.next().await.expect("update"), iface),
                Watching::Light(sink) => sink.endpoints().await,
            };
            if got == want {
                return;
            }
        }
    }
}

struct Noop;
impl zookeeper_async::Watcher for Noop {
    fn handle(&self, _: zookeeper_async::WatchedEvent) {}
}

fn main() {
    let zk = ZooKeeper::start();
    let mut w = Writer::start(&zk);
    for i in 0..interfaces() {
        for j in 0..10 {
            w.create_e(
                &provider_path(&iface(i), &url(&format!("10.10.{i}.{j}"), &iface(i))),
                "",
            );
        }
    }
    let servers = zk.servers();
    let adapter = Adapter::start(
        "adapter-zookeeper",
        &["--zk-servers", &servers, "--coalesce", "0"],
    );
    adapter.wait_ready();
    let target = iface(42);
    let extra = provider_path(&target, &url("10.99.0.1", &target));
    let dir = format!("/dubbo/{target}/providers");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (floor, same, ours, (same_light, light)) = rt.block_on(async {
        // Floor: ZooKeeper's child watch on the same directory, fired by the same write.
        let client = zookeeper_async::ZooKeeper::connect(&servers, Duration::from_secs(10), Noop)
            .await
            .expect("zk client");
        let mut floor = histogram();
        for round in 0..round_count() {
            let (tx, rx) = mpsc::channel();
            client
                .get_children_w(&dir, move |_| {
                    let _ = tx.send(Instant::now());
                })
                .await
                .expect("watch");
            let t0 = Instant::now();
            if round % 2 == 0 {
                w.create_e(&extra, "");
            } else {
                w.delete(&extra);
            }
            let fired =
                tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(5)))
                    .await
                    .expect("join")
                    .expect("watch fired");
            record(&mut floor, fired.duration_since(t0));
        }
        // Ours: the same writes until an xDS sink holds the change; first mcpctl's sink, then
        // the light one, each with the floor on its own writes.
        let mut full = Sink::connect(SinkOptions::new(format!("xds://{}", adapter.grpc)))
            .await
            .expect("sink");
        let mut u = full.next().await.expect("first state");
        while endpoints(&u, &target) != 10 {
            u = full.next().await.expect("state");
        }
        let mut sink = Watching::Mcpctl(full);
        let (same, ours) = rounds(&client, &mut w, &dir, &extra, &target, &mut sink).await;
        drop(sink);
        let mut sink = Watching::Light(LightSink::connect(adapter.grpc, &target).await);
        let light = rounds(&client, &mut w, &dir, &extra, &target, &mut sink).await;
        (floor, same, ours, light)
    });
    println!(
        "change-to-sink latency on real ZooKeeper ({} providers over {} interfaces, {} changes, coalescing off)",
        interfaces() * 10,
        interfaces(),
        round_count()
    );
    report("floor: zookeeper child watch fires", &floor);
    report("floor on the same writes (50 ms apart)", &same);
    report("adapter-zookeeper -> xDS sink holds the change", &ours);
    println!(
        "ratio {}; to the floor on the same writes: {}",
        p50_p99_ratios(&ours, &floor),
        p50_p99_ratios(&ours, &same)
    );
    println!("the same with a sink that decodes only the watched interface's ServiceEntry:");
    report("floor on the same writes (50 ms apart)", &same_light);
    report("adapter-zookeeper -> light sink holds it", &light);
    println!(
        "ratio to the floor on the same writes: {}",
        p50_p99_ratios(&light, &same_light)
    );
}

/// `round_count()` writes 50 ms apart, alternately adding and removing one provider of `iface`: the
/// floor on each write (the bench's own watch on `dir`) and the time until `sink` holds it.
async fn rounds(
    client: &zookeeper_async::ZooKeeper,
    w: &mut Writer,
    dir: &str,
    extra: &str,
    iface: &str,
    sink: &mut Watching,
) -> (Histogram<u64>, Histogram<u64>) {
    let (mut ours, mut same) = (histogram(), histogram());
    for round in 0..round_count() {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let want = if round % 2 == 0 { 11 } else { 10 };
        // The floor on this very write: the same watch as the adapter's, from the bench's client.
        let (tx, rx) = mpsc::channel();
        client
            .get_children_w(dir, move |_| {
                let _ = tx.send(Instant::now());
            })
            .await
            .expect("watch");
        let t0 = Instant::now();
        if round % 2 == 0 {
            w.create_e(extra, "");
        } else {
            w.delete(extra);
        }
        sink.until(iface, want).await;
        record(&mut ours, t0.elapsed());
        let fired = tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(5)))
            .await
            .expect("join")
            .expect("watch fired");
        record(&mut same, fired.duration_since(t0));
    }
    (same, ours)
}
