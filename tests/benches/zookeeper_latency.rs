//! Change-to-sink latency on a real ZooKeeper: a Dubbo provider appears or disappears, how long
//! until an xDS sink holds the new endpoint set (1,000 providers over 100 interfaces). The floor,
//! measured in the same run, is ZooKeeper's own child watch firing after the same write: once
//! with writes back to back (as first measured), and once on the adapter's own writes, which
//! are 50 ms apart. On a 2-core machine the watch fired later after such a gap than back to
//! back (paced like the adapter's, the first floor's p50 went from ~2.3 to ~3.4 ms), so only
//! the second compares like with like.
//!
//!     cargo build --release -p adapter-zookeeper -p mcpctl && \
//!       cargo bench -p e2e --bench zookeeper_latency
//!
//! (needs Debian's zookeeper: scripts/install-zookeeper.sh).

use std::sync::mpsc;
use std::time::{Duration, Instant};

use e2e::zookeeper::{provider_path, Writer, ZooKeeper};
use e2e::Adapter;
use hdrhistogram::Histogram;
use mcpctl::sink::{Sink, SinkOptions};

const ROUNDS: usize = 200;

fn iface(i: usize) -> String {
    format!("com.example.svc{i:03}")
}

fn url(ip: &str, iface: &str) -> String {
    format!(
        "dubbo://{ip}:20880/{iface}?application=demo&interface={iface}&side=provider&dubbo=2.0.2"
    )
}

fn report(what: &str, h: &Histogram<u64>) {
    println!(
        "{what:<46} n={:<4} p50={:>7.2}ms p90={:>7.2}ms p99={:>7.2}ms max={:>7.2}ms",
        h.len(),
        h.value_at_quantile(0.5) as f64 / 1000.0,
        h.value_at_quantile(0.9) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
        h.max() as f64 / 1000.0
    );
}

fn endpoints(u: &mcpctl::sink::Update, iface: &str) -> usize {
    u.state
        .values()
        .find(|r| r.spec.hosts.iter().any(|h| h.starts_with(iface)))
        .map_or(0, |r| r.spec.endpoints.len())
}

struct Noop;
impl zookeeper_async::Watcher for Noop {
    fn handle(&self, _: zookeeper_async::WatchedEvent) {}
}

fn main() {
    let zk = ZooKeeper::start();
    let mut w = Writer::start(&zk);
    for i in 0..100 {
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
    let (floor, same, ours) = rt.block_on(async {
        // Floor: ZooKeeper's child watch on the same directory, fired by the same write.
        let client = zookeeper_async::ZooKeeper::connect(&servers, Duration::from_secs(10), Noop)
            .await
            .expect("zk client");
        let mut floor = Histogram::<u64>::new(3).expect("histogram");
        for round in 0..ROUNDS {
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
            floor
                .record(fired.duration_since(t0).as_micros() as u64)
                .expect("record");
        }
        // Ours: the same writes until an xDS sink holds the change.
        let mut sink = Sink::connect(SinkOptions::new(format!("xds://{}", adapter.grpc)))
            .await
            .expect("sink");
        let mut u = sink.next().await.expect("first state");
        while endpoints(&u, &target) != 10 {
            u = sink.next().await.expect("state");
        }
        let mut ours = Histogram::<u64>::new(3).expect("histogram");
        let mut same = Histogram::<u64>::new(3).expect("histogram");
        for round in 0..ROUNDS {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let want = if round % 2 == 0 { 11 } else { 10 };
            // The floor on this very write: the same watch as above, from the bench's client.
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
            loop {
                let u = sink.next().await.expect("update");
                if endpoints(&u, &target) == want {
                    break;
                }
            }
            ours.record(t0.elapsed().as_micros() as u64)
                .expect("record");
            let fired =
                tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(5)))
                    .await
                    .expect("join")
                    .expect("watch fired");
            same.record(fired.duration_since(t0).as_micros() as u64)
                .expect("record");
        }
        (floor, same, ours)
    });
    println!("change-to-sink latency on real ZooKeeper (1,000 providers over 100 interfaces, {ROUNDS} changes, coalescing off)");
    report("floor: zookeeper child watch fires", &floor);
    report("floor on the same writes (50 ms apart)", &same);
    report("adapter-zookeeper -> xDS sink holds the change", &ours);
    let ratio = |q: f64, f: &Histogram<u64>| {
        ours.value_at_quantile(q) as f64 / f.value_at_quantile(q).max(1) as f64
    };
    println!(
        "ratio p50 {:.2}x, p99 {:.2}x; to the floor on the same writes: p50 {:.2}x, p99 {:.2}x",
        ratio(0.5, &floor),
        ratio(0.99, &floor),
        ratio(0.5, &same),
        ratio(0.99, &same)
    );
}
