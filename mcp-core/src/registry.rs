//! The contract between an adapter and the core.
//!
//! An adapter implements [`Registry`]: a watch stream that starts with a full [`RegistryEvent::Reset`]
//! and then carries upserts and removals. Every error is retryable: the core logs it, marks the
//! source unhealthy (last good state still served), backs off, and calls [`Registry::watch`] again,
//! which must start with a new `Reset`. A watch that can resume by itself after an error (from a
//! resource version, an index) says so with [`RegistryEvent::Retrying`] instead of ending, and
//! [`RegistryEvent::Recovered`] once the registry answers again. Adapters that prefer writing a loop to writing a stream use
//! [`channel_stream`].

use std::future::Future;

use futures::stream::BoxStream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use crate::model::{Service, ServiceKey};
use crate::vip::VipCidr;

/// A change in the registry.
// Events are moved one at a time through a channel, never stored in bulk: boxing `Upsert` would
// only add an allocation per change.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum RegistryEvent {
    /// The authoritative full set: anything not in it is removed.
    Reset(Vec<Service>),
    /// A service appeared or changed.
    Upsert(Service),
    /// A service disappeared.
    Remove(ServiceKey),
    /// Changes that belong together (one file's edit, one re-read): applied as one, so no push
    /// carries some of them without the others, however slowly they arrive and whatever the
    /// coalescing window. (Sent as separate events, a busy adapter could publish a set that
    /// never existed in the registry, and one edit would cost sinks two pushes.)
    Changes {
        /// Services that appeared or changed.
        upserts: Vec<Service>,
        /// Services that disappeared.
        removes: Vec<ServiceKey>,
    },
    /// Registry objects in `scope` that were skipped as bad data; replaces what was reported for
    /// that scope before (an empty list clears it). Shown on /debug/resources and in metrics.
    Problems {
        /// What the problems belong to (a file, a service path).
        scope: String,
        /// One line per skipped object, naming it and what is wrong.
        problems: Vec<String>,
    },
    /// The watch hit an error it retries by itself from where it was (a dropped connection, a
    /// 5xx, a 429): everything it sent stays valid and nothing is listed again. The registry is
    /// reported unhealthy with this reason (/registryz, the `registry` health service,
    /// `mcp_adapter_registry_healthy`, `mcp_adapter_registry_retries_total`) until
    /// [`RegistryEvent::Recovered`] or the next `Reset`; it is not a watch failure
    /// (`mcp_adapter_registry_errors_total` counts those). May come before the first `Reset`.
    Retrying(RegistryError),
    /// The registry answers again after [`RegistryEvent::Retrying`]; the watch goes on.
    Recovered,
}

/// Why the registry cannot be read right now. All variants are retryable.
#[derive(Clone, Debug, thiserror::Error)]
pub enum RegistryError {
    /// The registry could not be reached or answered with a server error.
    #[error("registry unavailable: {0}")]
    Unavailable(String),
    /// The registry refused our credentials.
    #[error("registry refused access: {0}")]
    Unauthorized(String),
    /// The registry answered something we could not understand.
    #[error("unexpected answer from registry: {0}")]
    BadResponse(String),
    /// The watch ended without an error (the core restarts it).
    #[error("watch ended")]
    Ended,
}

impl RegistryError {
    /// Short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Unavailable(_) => "unavailable",
            Self::Unauthorized(_) => "unauthorized",
            Self::BadResponse(_) => "bad_response",
            Self::Ended => "ended",
        }
    }
}

/// A service registry that can be watched. Implemented once per adapter crate.
pub trait Registry: Send + Sync + 'static {
    /// Lowercase noun used in metric labels, resource labels and logs (`consul`).
    const NAME: &'static str;
    /// Default `--host-suffix` appended to relative hosts (`service.consul`); may be empty.
    const DEFAULT_HOST_SUFFIX: &'static str;
    /// Default `--namespace` for the generated ServiceEntries.
    const DEFAULT_NAMESPACE: &'static str;
    /// Default `--vip-cidr`: each adapter its own range, so that two adapters feeding one istiod
    /// never hand out the same address (two adapters of one kind need `--vip-cidr` set apart).
    const DEFAULT_VIP_CIDR: VipCidr = VipCidr::range(242, 0, 0, 0, 16);
    /// The parts of a service's name `--host-template` may use: `service` always, and what the
    /// adapter puts in [`crate::model::Service::name_parts`] (Nacos' `group`, ...).
    const NAME_PARTS: &'static [&'static str] = &["service"];

    /// Watch the registry. The stream must start with a `Reset`; after an error item the core
    /// backs off and calls `watch` again.
    fn watch(&self) -> BoxStream<'static, Result<RegistryEvent, RegistryError>>;

    /// The registry's own metrics (named `mcp_adapter_*`; the `registry` label is added), served
    /// with the core's on /metrics: what only the adapter can count, such as its requests to
    /// the registry. None by default.
    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        Vec::new()
    }
}

/// Where a [`channel_stream`] body sends its events.
#[derive(Clone, Debug)]
pub struct EventSender {
    tx: mpsc::Sender<Result<RegistryEvent, RegistryError>>,
}

impl EventSender {
    /// Sends one event; `Err(Ended)` once the core dropped the watch (the body should return).
    pub async fn send(&self, event: RegistryEvent) -> Result<(), RegistryError> {
        self.tx
            .send(Ok(event))
            .await
            .map_err(|_| RegistryError::Ended)
    }
}

/// Turns a loop that sends events into a watch stream. The body runs on its own task; when it
/// returns an error, that error ends the stream (and the core retries); when the stream is dropped
/// the task is aborted.
pub fn channel_stream<F, Fut>(body: F) -> BoxStream<'static, Result<RegistryEvent, RegistryError>>
where
    F: FnOnce(EventSender) -> Fut,
    Fut: Future<Output = Result<(), RegistryError>> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(256);
    let err_tx = tx.clone();
    let fut = body(EventSender { tx });
    let task = tokio::spawn(async move {
        let result = fut.await;
        let _ = err_tx
            .send(Err(result.err().unwrap_or(RegistryError::Ended)))
            .await;
    });
    let guard = AbortOnDrop(task);
    Box::pin(ReceiverStream::new(rx).map(move |item| {
        let _keep = &guard;
        item
    }))
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
