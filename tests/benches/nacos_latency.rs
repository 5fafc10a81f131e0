//! Change-to-sink latency on the real Nacos 2.4.3 server, through Istio's own client: an
//! instance is deregistered or registered again over the Open API; how long until the server's
//! own push reaches a bare subscriber (the floor, measured in the same run: a gRPC session that
//! only subscribes, as any Nacos client does) and until Istio's client stores the new endpoint
//! set from adapter-nacos.
//!
//!     cargo build -p adapter-nacos && cargo bench -p e2e --bench nacos_latency
//!
//! (needs target/nacos/nacos-2.4.3 from tests/nacos/build.sh and target/adsc from
//! tests/istio-adsc/build.sh).

use std::sync::mpsc;
use std::time::{Duration, Instant};

use adapter_nacos::http::parse_server;
use adapter_nacos::inbox::Inbox;
use adapter_nacos::session::{Connect, GrpcTls, Session};
use adapter_nacos::wire::NACOS_CLIENT_MAX_MESSAGE;
use e2e::nacos::{Instance, Nacos, Version, DEFAULT_GROUP};
use e2e::{endpoint_addresses, item, Adapter, Adsc, IstioVersion};
use latency::{histogram_of, p50_p99_ratios, print_quantiles};

mod latency;
mod smoke;

const ORDERS: &str = "nacos/orders.default-group.public";

/// A bare subscriber to `orders`: the time and instance count of every push, on `out`.
fn floor_subscriber(nacos: &Nacos, out: mpsc::Sender<(Instant, usize)>) {
    let server = parse_server(&nacos.server_addr(), 1000).expect("server address");
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let inbox = std::sync::Arc::new(Inbox::default());
            let connect = Connect {
                server: &server,
                tls: &GrpcTls::default(),
                timeout: Duration::from_secs(10),
                max_message: NACOS_CLIENT_MAX_MESSAGE,
            };
            let session = Session::open(&connect, "public", inbox.clone())
                .await
                .expect("floor session");
            session
                .caller()
                .subscribe(DEFAULT_GROUP, "orders", None)
                .await
                .expect("floor subscription");
            loop {
                inbox.wait().await;
                let taken = inbox.take();
                // The server stopped at the end of the bench (during it, the main thread's wait
                // for the next push fails and says so).
                if taken.lost.is_some() {
                    return;
                }
                for info in taken.pushes.into_values() {
                    let n = info
                        .hosts
                        .iter()
                        .filter(|h| h.as_ref().is_ok_and(|h| h.healthy && h.enabled))
                        .count();
                    if out.send((Instant::now(), n)).is_err() {
                        return;
                    }
                }
            }
        });
    });
}

fn main() {
    let nacos = Nacos::start(Version::V2);
    let keep = Instance::new("orders", "10.0.0.1", 8080);
    let flip = Instance::new("orders", "10.0.0.2", 8080);
    nacos.register(&keep);
    nacos.register(&flip);
    let addr = nacos.server_addr();
    let adapter = Adapter::start("adapter-nacos", &["--nacos-addr", addr.as_str()]);
    adapter.wait_ready();
    let mut adsc = Adsc::start(IstioVersion::Current, adapter.grpc);
    adsc.wait_items("orders with two endpoints", |items| {
        item(items, ORDERS).is_some_and(|o| endpoint_addresses(o).len() == 2)
    });
    let (push_tx, pushes) = mpsc::channel();
    floor_subscriber(&nacos, push_tx);

    let rounds = smoke::scaled(40, 2);
    let (mut floor, mut sink) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        // Apart from the server's push batching (500 ms), so each change is a push of its own.
        std::thread::sleep(Duration::from_millis(1200 + (round as u64 * 137) % 500));
        while pushes.try_recv().is_ok() {}
        let out = round % 2 == 0;
        let want = if out { 1 } else { 2 };
        let t0 = Instant::now();
        if out {
            nacos.deregister(&flip);
        } else {
            nacos.register(&flip);
        }
        let t_push = loop {
            let (t, n) = pushes
                .recv_timeout(Duration::from_secs(30))
                .expect("the server's push to the bare subscriber");
            if n == want {
                break t;
            }
        };
        adsc.wait_items("the change", |items| {
            item(items, ORDERS).is_some_and(|o| endpoint_addresses(o).len() == want)
        });
        let t_sink = Instant::now();
        floor.push(t_push.saturating_duration_since(t0));
        sink.push(t_sink.saturating_duration_since(t0));
    }
    let (floor, sink) = (histogram_of(&floor), histogram_of(&sink));
    println!("nacos latency ({rounds} changes: an instance deregistered, then registered again)");
    print_quantiles(34, "server push to a bare subscriber", &floor);
    print_quantiles(34, "adapter-nacos -> Istio's client", &sink);
    println!("ratio to the floor: {}", p50_p99_ratios(&sink, &floor));
    adapter.assert_no_registry_errors("during the bench");
}
