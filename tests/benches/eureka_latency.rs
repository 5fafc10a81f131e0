//! Change-to-sink latency on a real Eureka server, through Istio's own client: an instance's
//! status flips, how long until the server's own `/apps/delta` shows it (the floor, measured in
//! the same run) and until Istio's client stores the new endpoint set.
//!
//!     cargo build -p adapter-eureka && cargo bench -p e2e --bench eureka_latency
//!
//! (needs target/eureka/eureka-test.jar from tests/eureka/build.sh and target/adsc from
//! tests/istio-adsc/build.sh).

use std::time::Duration;

use e2e::eureka::{Eureka, Instance};
use e2e::{endpoint_addresses, item, Adapter, Adsc, IstioVersion};
use latency::{ms_between as ms, summary};

mod latency;
mod smoke;

/// Change-to-sink latency: for status flips of one instance, how soon the server's own
/// `/apps/delta` shows the change (the floor) and how soon Istio's client stores it.
fn latency(refresh: &str, refresh_ms: u64) {
    let eureka = Eureka::start();
    eureka.register(&Instance::new("orders", "orders-1", "10.0.0.1", 8080));
    eureka.register(&Instance::new("orders", "orders-2", "10.0.0.2", 8080));
    let url = eureka.url();
    let adapter = Adapter::start(
        "adapter-eureka",
        &["--eureka-url", url.as_str(), "--refresh-interval", refresh],
    );
    adapter.wait_ready();
    let mut adsc = Adsc::start(IstioVersion::Current, adapter.grpc);
    adsc.wait_items("orders with two endpoints", |items| {
        item(items, "eureka/orders").is_some_and(|o| endpoint_addresses(o).len() == 2)
    });
    let (mut floor, mut sink) = (Vec::new(), Vec::new());
    let rounds = smoke::scaled(10, 2);
    for round in 0..rounds {
        let down = round % 2 == 0;
        let want_status = if down { "OUT_OF_SERVICE" } else { "UP" };
        let want_endpoints = if down { 1 } else { 2 };
        // Spread the changes over the refresh period (each round starts right after a poll).
        std::thread::sleep(Duration::from_millis(
            100 + (round as u64 * 7 * refresh_ms / 10) % refresh_ms,
        ));
        let t0 = std::time::Instant::now();
        if down {
            eureka.set_status("orders", "orders-2", "OUT_OF_SERVICE");
        } else {
            eureka.clear_status("orders", "orders-2");
        }
        let (t_delta, t_sink) = std::thread::scope(|s| {
            let poll = s.spawn(|| loop {
                let d = eureka.delta().to_string();
                if d.contains("orders-2") && d.contains(want_status) {
                    return std::time::Instant::now();
                }
                std::thread::sleep(Duration::from_millis(20));
            });
            adsc.wait_items("the change", |items| {
                item(items, "eureka/orders")
                    .is_some_and(|o| endpoint_addresses(o).len() == want_endpoints)
            });
            let t_sink = std::time::Instant::now();
            (poll.join().expect("delta poll"), t_sink)
        });
        floor.push(ms(t0, t_delta));
        sink.push(ms(t0, t_sink));
    }
    let stats = |v: &mut Vec<f64>| {
        let s = summary(v);
        format!(
            "min {:.0} ms, mean {:.0} ms, max {:.0} ms",
            s.min, s.mean, s.max
        )
    };
    eprintln!(
        "eureka latency (--refresh-interval {refresh}, {rounds} status flips): server /apps/delta {}; Istio client {}",
        stats(&mut floor),
        stats(&mut sink)
    );
}

fn main() {
    // A smoke run: the shortest refresh interval only.
    if !smoke::smoke() {
        latency("5s", 5000);
    }
    latency("1s", 1000);
}
