//! Test support: a registry driven by the test, model builders, and (in [`bench`]) what the
//! benches measure a process with.
//!
//! Used by the conformance tests and the benchmarks (this crate's and the end-to-end scale bench),
//! behind the `testing` feature (and in this crate's unit tests): never compiled into an adapter's
//! binary.

pub mod bench;
pub mod shaped;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::stream::{BoxStream, StreamExt};
use tokio::sync::mpsc;

use proto::istio::networking::v1alpha3::{
    service_entry, ServiceEntry, ServicePort, WorkloadEntry, WorkloadSelector,
};

use crate::model::{Endpoint, Port, Service, ServiceKey};
use crate::registry::{Registry, RegistryError, RegistryEvent};

type Item = Result<RegistryEvent, RegistryError>;

/// A registry whose events the test sends through a [`FakeHandle`]. Each call to `watch` (the
/// first, and every retry after an error) takes the next stream the handle opened; the test
/// controls what each watch sees.
#[derive(Clone, Debug)]
pub struct FakeRegistry {
    streams: Arc<Mutex<mpsc::UnboundedReceiver<mpsc::UnboundedReceiver<Item>>>>,
    taken: Arc<AtomicUsize>,
}

/// Drives a [`FakeRegistry`].
#[derive(Clone, Debug)]
pub struct FakeHandle {
    streams: mpsc::UnboundedSender<mpsc::UnboundedReceiver<Item>>,
    current: Arc<Mutex<Option<mpsc::UnboundedSender<Item>>>>,
    /// Items the core has taken from the watch streams so far.
    taken: Arc<AtomicUsize>,
}

/// A fake registry with its handle; one watch stream is already open.
pub fn fake_registry() -> (FakeRegistry, FakeHandle) {
    let (tx, rx) = mpsc::unbounded_channel();
    let taken = Arc::new(AtomicUsize::new(0));
    let handle = FakeHandle {
        streams: tx,
        current: Arc::new(Mutex::new(None)),
        taken: Arc::clone(&taken),
    };
    handle.reconnect();
    (
        FakeRegistry {
            streams: Arc::new(Mutex::new(rx)),
            taken,
        },
        handle,
    )
}

impl FakeHandle {
    /// Sends an event on the current watch stream.
    pub fn send(&self, event: RegistryEvent) {
        let current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = current.as_ref() {
            let _ = tx.send(Ok(event));
        }
    }

    /// Fails the current watch (the core backs off and calls `watch` again, getting a fresh
    /// stream opened here).
    pub fn fail(&self, error: RegistryError) {
        {
            let current = self.current.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(tx) = current.as_ref() {
                let _ = tx.send(Err(error));
            }
        }
        self.reconnect();
    }

    /// Events and failures the core has taken from the watch streams so far. A test that must
    /// know an event reached the core before time moves on (a coalescing window under paused
    /// time) waits for this instead of sleeping.
    pub fn taken(&self) -> usize {
        self.taken.load(Ordering::SeqCst)
    }

    fn reconnect(&self) {
        let (tx, rx) = mpsc::unbounded_channel();
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
        let _ = self.streams.send(rx);
    }
}

impl Registry for FakeRegistry {
    const NAME: &'static str = "fake";
    const DEFAULT_HOST_SUFFIX: &'static str = "fake.local";
    const DEFAULT_NAMESPACE: &'static str = "fake";

    fn watch(&self) -> BoxStream<'static, Item> {
        let next = self
            .streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .try_recv()
            .ok();
        match next {
            Some(rx) => {
                let taken = Arc::clone(&self.taken);
                Box::pin(
                    tokio_stream::wrappers::UnboundedReceiverStream::new(rx).inspect(move |_| {
                        taken.fetch_add(1, Ordering::SeqCst);
                    }),
                )
            }
            None => Box::pin(futures::stream::pending()),
        }
    }
}

/// A valid service `name` with one HTTP port 8080 and `endpoints` IPs 10.x.y.z.
pub fn mk_service(name: &str, endpoints: usize) -> Service {
    let mut s = Service::new(ServiceKey::new(name), format!("test service {name}"));
    s.ports.push(http_port(8080));
    s.endpoints = (0..endpoints).map(mk_endpoint).collect();
    s
}

/// Port `number` named `http`, protocol HTTP, no target port.
fn http_port(number: u32) -> Port {
    Port {
        number,
        name: "http".into(),
        protocol: Some("HTTP".into()),
        target_port: None,
    }
}

/// Service `name` with one HTTP port 80 and one endpoint at `ip`: the smallest service
/// `translate` serves.
pub fn mk_http_service(name: &str, ip: &str) -> Service {
    let mut s = Service::new(ServiceKey::new(name), format!("test {name}"));
    s.ports.push(http_port(80));
    s.endpoints.push(Endpoint {
        address: ip.into(),
        ..Default::default()
    });
    s
}

/// Endpoint number `i`: address 10.(i/65536).(i/256%256).(i%256) with two labels.
pub fn mk_endpoint(i: usize) -> Endpoint {
    Endpoint {
        address: format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255),
        labels: [
            ("version", format!("v{}", i % 3)),
            ("zone", format!("z{}", i % 2)),
        ]
        .into_iter()
        .collect(),
        ..Default::default()
    }
}

/// Sum of every series of metric `name` in a Prometheus text exposition (0 when absent).
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A ServiceEntry with every field set (two ports, two endpoints, a workload selector), for
/// rendering tests.
pub fn filled_service_entry() -> ServiceEntry {
    ServiceEntry {
        hosts: vec!["api.example.com".into(), "api2.example.com".into()],
        addresses: vec!["10.0.0.1/32".into()],
        ports: vec![
            ServicePort {
                number: 443,
                protocol: "TLS".into(),
                name: "tls".into(),
                target_port: 8443,
            },
            ServicePort {
                number: 80,
                protocol: "HTTP".into(),
                name: "http".into(),
                target_port: 0,
            },
        ],
        location: service_entry::Location::MeshInternal as i32,
        resolution: service_entry::Resolution::DnsRoundRobin as i32,
        endpoints: vec![
            WorkloadEntry {
                address: "1.2.3.4".into(),
                ports: [("tls".to_string(), 9443u32), ("http".to_string(), 8080)].into(),
                labels: [("zone".to_string(), "a".to_string())].into(),
                network: "net1".into(),
                locality: "us/east".into(),
                weight: 7,
                service_account: "sa".into(),
            },
            WorkloadEntry {
                address: "5.6.7.8".into(),
                ..Default::default()
            },
        ],
        export_to: vec![".".into()],
        subject_alt_names: vec!["spiffe://x".into()],
        workload_selector: Some(WorkloadSelector {
            labels: [("app".to_string(), "db".to_string())].into(),
        }),
    }
}

/// A ServiceEntry port with no target port (the ServiceEntry rules' tests, here and against
/// Istio's Go code in the end-to-end tests).
pub fn se_port(number: u32, name: &str, protocol: &str) -> ServicePort {
    ServicePort {
        number,
        protocol: protocol.into(),
        name: name.into(),
        target_port: 0,
    }
}

/// A ServiceEntry endpoint with only its address set.
pub fn se_endpoint(address: &str) -> WorkloadEntry {
    WorkloadEntry {
        address: address.into(),
        ..Default::default()
    }
}

/// One step of splitmix64 on `state`: the seeded generators of the generated-case tests (here
/// and end to end), whose failures name a seed to replay.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A small deterministic pseudo-random generator (xorshift64) for tests that replay long random
/// histories: the same seed gives the same history on every run, with no dependency.
#[derive(Debug)]
pub struct Rng(pub u64);

impl Rng {
    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// An entry with no body, for tests that only look at names and versions.
pub fn mk_entry(name: &str, version: &str) -> Arc<crate::cache::Entry> {
    Arc::new(crate::cache::Entry {
        name: name.into(),
        version: version.into(),
        resource: bytes::Bytes::new(),
        summary: crate::cache::Summary {
            hosts: vec![],
            ports: 0,
            endpoints: 0,
            create_time: 0,
        },
    })
}
