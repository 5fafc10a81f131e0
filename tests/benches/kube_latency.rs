//! Change-to-sink latency on a real Kubernetes API server, through Istio's own client: an
//! EndpointSlice is rewritten (a pod added or removed), how long until the API server's own
//! watch delivers the event (the floor, measured in the same run by a plain watch request) and
//! until Istio's client stores the new endpoint set.
//!
//!     cargo build -p adapter-kube && cargo bench -p e2e --bench kube_latency
//!
//! (needs target/kube from tests/go-peers/build.sh and target/adsc).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use e2e::kube::{ready, service, slice, slices_path, KubeApiServer, ADMIN_TOKEN};
use e2e::{endpoint_addresses, item, Adapter, Adsc, IstioVersion};
use latency::{ms_between as ms, summary};

mod latency;
mod smoke;

/// The web slice with `n` ready endpoints.
fn web_slice(n: usize) -> serde_json::Value {
    let eps = (1..=n).map(|i| ready(&format!("10.1.0.{i}"))).collect();
    slice("shop", "web-1", "web", "IPv4", &[("http", 8080)], eps)
}

fn main() {
    let kube = KubeApiServer::start();
    kube.namespace("shop");
    kube.apply_service(&service("shop", "web", &[("http", 80, 8080)]));
    let stored = kube.apply_slice(&web_slice(2));
    let kc = kube.kubeconfig().display().to_string();
    let adapter = Adapter::start("adapter-kube", &["--kubeconfig", kc.as_str()]);
    adapter.wait_ready();
    let mut adsc = Adsc::start(IstioVersion::Current, adapter.grpc);
    adsc.wait_items("web with two endpoints", |items| {
        item(items, "shop/web").is_some_and(|o| endpoint_addresses(o).len() == 2)
    });

    // The floor: the API server's own watch of the same slices, one JSON event per line.
    let rv = stored["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or("0");
    let mut watch = Command::new("curl")
        .args(["--silent", "--no-buffer", "--cacert"])
        .arg(kube.ca())
        .args(["--header", &format!("Authorization: Bearer {ADMIN_TOKEN}")])
        .arg(format!(
            "{}{}?watch=1&resourceVersion={rv}",
            kube.url(),
            slices_path("shop")
        ))
        .stdout(Stdio::piped())
        .spawn()
        .expect("curl watch");
    let (tx, events) = mpsc::channel::<(Instant, usize)>();
    let stdout = watch.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let n = serde_json::from_str::<serde_json::Value>(&line)
                .ok()
                .and_then(|e| e["object"]["endpoints"].as_array().map(Vec::len))
                .unwrap_or(0);
            if tx.send((Instant::now(), n)).is_err() {
                return;
            }
        }
    });

    let (mut floor, mut sink, mut over) = (Vec::new(), Vec::new(), Vec::new());
    let rounds = smoke::scaled(20, 2);
    for round in 0..rounds {
        let want = if round % 2 == 0 { 3 } else { 2 };
        std::thread::sleep(Duration::from_millis(200));
        while events.try_recv().is_ok() {}
        let t0 = Instant::now();
        kube.apply_slice(&web_slice(want));
        let t_watch = loop {
            let (t, n) = events
                .recv_timeout(Duration::from_secs(30))
                .expect("watch event");
            if n == want {
                break t;
            }
        };
        adsc.wait_items("the change", |items| {
            item(items, "shop/web").is_some_and(|o| endpoint_addresses(o).len() == want)
        });
        let t_sink = Instant::now();
        floor.push(ms(t0, t_watch));
        sink.push(ms(t0, t_sink));
        over.push(ms(t_watch, t_sink));
    }
    let _ = watch.kill();
    let _ = watch.wait();
    let stats = |v: &mut Vec<f64>| {
        let s = summary(v);
        format!(
            "min {:.1} ms, p50 {:.1} ms, mean {:.1} ms, max {:.1} ms",
            s.min, s.p50, s.mean, s.max
        )
    };
    eprintln!(
        "kube latency ({rounds} EndpointSlice rewrites, write -> ...): API server watch {}; Istio client {}; sink after watch {}",
        stats(&mut floor),
        stats(&mut sink),
        stats(&mut over)
    );
}
