//! xDS sinks that ACK on their own schedule: SotW or delta streams subscribed to ServiceEntries,
//! each on a connection of its own (as separate istiods would be), that read every response at
//! once and ACK it after a delay: none for a well-behaved sink, seconds for a slow one; or NACK
//! every response, as an istiod that rejects what it is sent does. They run
//! on a runtime of their own thread and record what they received, so a test can ask whether a
//! sink saw a version and wait for it.
//!
//! Every ServiceEntry they receive goes through Istio's own validation
//! ([`crate::istio_validate`]); one that Istio refuses fails the test ([`XdsSinks::state`],
//! [`XdsSinks::wait_version`] and the drop at the end of the test panic with it).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::google::rpc::Status as RpcStatus;
use tokio_stream::wrappers::UnboundedReceiverStream;

use prost::Message;
use proto::istio::mcp::v1alpha1::Resource as McpResource;
use proto::istio::networking::v1alpha3::ServiceEntry;

use crate::background::Background;
use crate::istio_validate;

/// The type URL the sinks subscribe to (istiod 1.24+).
pub const SERVICE_ENTRY: &str = "networking.istio.io/v1/ServiceEntry";

/// Which xDS variant a sink speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavour {
    /// `StreamAggregatedResources`: every response is the full set.
    Sotw,
    /// `DeltaAggregatedResources`: changes and removals after the first response.
    Delta,
}

/// One sink: its protocol and how long it waits before ACKing each response.
#[derive(Clone, Copy, Debug)]
pub struct SinkSpec {
    /// Protocol.
    pub flavour: Flavour,
    /// Time between reading a response and ACKing it.
    pub ack_delay: Duration,
    /// NACK every response with this detail instead of ACKing it.
    pub nack: Option<&'static str>,
    /// The node id its first request gives.
    pub node: Option<&'static str>,
}

impl SinkSpec {
    /// A sink that ACKs every response at once and gives no node id.
    pub fn acking(flavour: Flavour) -> SinkSpec {
        SinkSpec {
            flavour,
            ack_delay: Duration::ZERO,
            nack: None,
            node: None,
        }
    }
}

fn node(spec: &SinkSpec) -> Option<Node> {
    spec.node.map(|id| Node {
        id: id.to_string(),
        ..Default::default()
    })
}

fn nack(spec: &SinkSpec) -> Option<RpcStatus> {
    spec.nack.map(|detail| RpcStatus {
        code: 3,
        message: detail.to_string(),
        ..Default::default()
    })
}

/// What one sink has seen.
#[derive(Clone, Debug, Default)]
pub struct SinkState {
    /// The version of every response, in order (SotW `version_info`, delta
    /// `system_version_info`).
    pub versions: Vec<String>,
    /// Names the sink holds now.
    pub names: BTreeSet<String>,
    /// Why the stream ended, once it has.
    pub ended: Option<String>,
}

struct Shared {
    sinks: Mutex<Vec<SinkState>>,
    changed: Condvar,
    /// Served ServiceEntries Istio refuses, each with Istio's errors.
    invalid: Mutex<Vec<String>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Vec<SinkState>> {
        self.sinks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Panics with the invalid entries the sinks were served, if any.
    fn assert_all_valid(&self) {
        let invalid = self.invalid.lock().unwrap_or_else(|e| e.into_inner());
        assert!(
            invalid.is_empty(),
            "the adapter served ServiceEntries that Istio refuses:\n{}",
            invalid.join("\n")
        );
    }

    /// Checks the MCP resources of one response with Istio's validation; records what fails.
    fn check<'a>(&self, sink: usize, version: &str, resources: impl Iterator<Item = &'a Any>) {
        let context = format!("xDS sink {sink}, response {version:?}");
        // The validator is a child process answering over pipes: a blocking call.
        let found = tokio::task::block_in_place(|| {
            resources
                .filter(|a| a.type_url.ends_with("/istio.mcp.v1alpha1.Resource"))
                .filter_map(|a| invalid_entry(&context, &a.value))
                .collect::<Vec<_>>()
        });
        if !found.is_empty() {
            self.invalid
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(found);
            self.changed.notify_all();
        }
    }
}

/// Why one MCP `Resource` (encoded) is not a ServiceEntry Istio accepts, or `None` when it is (or
/// carries another type).
fn invalid_entry(context: &str, resource: &[u8]) -> Option<String> {
    let r = match McpResource::decode(resource) {
        Ok(r) => r,
        Err(e) => return Some(format!("{context}: not an MCP Resource: {e}")),
    };
    let body = r.body?;
    if !body
        .type_url
        .ends_with("/istio.networking.v1alpha3.ServiceEntry")
    {
        return None;
    }
    let full = r.metadata.map(|m| m.name).unwrap_or_default();
    let (namespace, name) = full.split_once('/').unwrap_or(("", full.as_str()));
    let ask = || match ServiceEntry::decode(body.value.as_slice()) {
        Ok(se) => istio_validate::verdict(name, namespace, &se),
        Err(e) => istio_validate::Verdict {
            errors: vec![format!("not a ServiceEntry: {e}")],
            ..Default::default()
        },
    };
    istio_validate::check_once(name, namespace, &body.value, ask)
        .err()
        .map(|e| format!("{context}: {e}"))
}

/// Running sinks; stopped (their streams closed) on drop.
pub struct XdsSinks {
    shared: Arc<Shared>,
    _thread: Background,
}

impl XdsSinks {
    /// Connects one sink per spec to `addr`; returns at once.
    pub fn start(addr: SocketAddr, specs: &[SinkSpec]) -> XdsSinks {
        let shared = Arc::new(Shared {
            sinks: Mutex::new(vec![SinkState::default(); specs.len()]),
            changed: Condvar::new(),
            invalid: Mutex::new(Vec::new()),
        });
        let specs = specs.to_vec();
        let out = shared.clone();
        let thread = Background::spawn(move |stopped| {
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let mut s = out.lock();
                    for sink in s.iter_mut() {
                        sink.ended = Some(format!("runtime: {e}"));
                    }
                    return;
                }
            };
            rt.block_on(async move {
                for (i, spec) in specs.into_iter().enumerate() {
                    let out = out.clone();
                    tokio::spawn(async move {
                        let ended = match run(addr, spec, i, &out).await {
                            Ok(()) => "the server ended the stream (OK)".to_string(),
                            Err(e) => e,
                        };
                        out.lock()[i].ended = Some(ended);
                        out.changed.notify_all();
                    });
                }
                let _ = stopped.await;
            });
            rt.shutdown_timeout(Duration::from_secs(2));
        });
        XdsSinks {
            shared,
            _thread: thread,
        }
    }

    /// What sink `i` has seen so far. Panics if any sink was served an invalid ServiceEntry.
    pub fn state(&self, i: usize) -> SinkState {
        self.shared.assert_all_valid();
        self.shared.lock()[i].clone()
    }

    /// How many sinks there are.
    pub fn len(&self) -> usize {
        self.shared.lock().len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until every sink in `which` has received version `version`; panics after
    /// `timeout`, when one of them ended, or when any was served an invalid ServiceEntry.
    pub fn wait_version(&self, which: &[usize], version: &str, timeout: Duration) {
        let end = Instant::now() + timeout;
        let mut s = self.shared.lock();
        loop {
            self.shared.assert_all_valid();
            let missing: Vec<usize> = which
                .iter()
                .copied()
                .filter(|&i| !s[i].versions.iter().any(|v| v == version))
                .collect();
            if missing.is_empty() {
                return;
            }
            for &i in &missing {
                if let Some(why) = &s[i].ended {
                    panic!("sink {i} ended ({why}) before it got version {version}");
                }
            }
            let now = Instant::now();
            assert!(
                now < end,
                "sinks {missing:?} did not get version {version} within {timeout:?}; the first has {:?}",
                s[missing[0]].versions.iter().rev().take(3).collect::<Vec<_>>()
            );
            s = self
                .shared
                .changed
                .wait_timeout(s, end - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl Drop for XdsSinks {
    /// The last check, for tests that never ask again after the final response.
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.shared.assert_all_valid();
        }
    }
}

async fn run(addr: SocketAddr, spec: SinkSpec, i: usize, out: &Shared) -> Result<(), String> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let mut client =
        AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(usize::MAX);
    let record = |version: String, upserted: Vec<String>, removed: &[String], full: bool| {
        let mut s = out.lock();
        let sink = &mut s[i];
        if full {
            sink.names.clear();
        }
        for n in removed {
            sink.names.remove(n);
        }
        sink.names.extend(upserted);
        sink.versions.push(version);
        out.changed.notify_all();
    };
    match spec.flavour {
        Flavour::Sotw => {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            tx.send(DiscoveryRequest {
                type_url: SERVICE_ENTRY.into(),
                node: node(&spec),
                ..Default::default()
            })
            .map_err(|e| e.to_string())?;
            let mut responses = client
                .stream_aggregated_resources(UnboundedReceiverStream::new(rx))
                .await
                .map_err(|e| format!("StreamAggregatedResources: {e}"))?
                .into_inner();
            while let Some(r) = responses.message().await.map_err(|e| e.to_string())? {
                out.check(i, &r.version_info, r.resources.iter());
                // SotW resources carry no names outside their bodies; count them instead.
                let names = (0..r.resources.len()).map(|n| n.to_string()).collect();
                record(r.version_info.clone(), names, &[], true);
                tokio::time::sleep(spec.ack_delay).await;
                tx.send(DiscoveryRequest {
                    type_url: r.type_url,
                    version_info: r.version_info,
                    response_nonce: r.nonce,
                    error_detail: nack(&spec),
                    ..Default::default()
                })
                .map_err(|e| e.to_string())?;
            }
        }
        Flavour::Delta => {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            tx.send(DeltaDiscoveryRequest {
                type_url: SERVICE_ENTRY.into(),
                node: node(&spec),
                ..Default::default()
            })
            .map_err(|e| e.to_string())?;
            let mut responses = client
                .delta_aggregated_resources(UnboundedReceiverStream::new(rx))
                .await
                .map_err(|e| format!("DeltaAggregatedResources: {e}"))?
                .into_inner();
            while let Some(r) = responses.message().await.map_err(|e| e.to_string())? {
                out.check(
                    i,
                    &r.system_version_info,
                    r.resources.iter().filter_map(|e| e.resource.as_ref()),
                );
                let names = r.resources.iter().map(|e| e.name.clone()).collect();
                record(
                    r.system_version_info.clone(),
                    names,
                    &r.removed_resources,
                    false,
                );
                tokio::time::sleep(spec.ack_delay).await;
                tx.send(DeltaDiscoveryRequest {
                    type_url: r.type_url,
                    response_nonce: r.nonce,
                    error_detail: nack(&spec),
                    ..Default::default()
                })
                .map_err(|e| e.to_string())?;
            }
        }
    }
    Ok(())
}
