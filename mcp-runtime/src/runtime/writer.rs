//! The writer task: the only task that moves the served set forward. It applies registry events
//! to the index, publishes a snapshot per shard at the end of each coalescing window, restores
//! `--state-file` at start, and keeps health and status in step with the registry watch.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::REGISTRY_HEALTH;
use crate::status::SharedStatus;
use mcp_core::cache::{state_file, Snapshot};
use mcp_core::clip::clip_error;
use mcp_core::index::Index;
use mcp_core::metrics::Metrics;
use mcp_core::registry::{Registry, RegistryError, RegistryEvent};
use mcp_core::retry::Backoff;
use mcp_core::shard::Shard;
use mcp_core::vip::QuarantinedVip;

/// The single writer: owns the index and publishes snapshots.
pub(super) struct Writer {
    pub(super) index: Index,
    /// One channel per shard (one without `--shards`).
    pub(super) snapshots: Vec<watch::Sender<Option<Arc<Snapshot>>>>,
    pub(super) status: SharedStatus,
    pub(super) metrics: Metrics,
    pub(super) coalesce: Duration,
    pub(super) health: tonic_health::server::HealthReporter,
    pub(super) shutdown: CancellationToken,
    /// `--state-file`, one per shard (none without the flag).
    pub(super) state_files: Vec<PathBuf>,
    /// The virtual IPs in quarantine, for the state files' savers (one set for every shard:
    /// the addresses are allocated once for the whole index).
    pub(super) vip_quarantine: watch::Sender<Arc<[QuarantinedVip]>>,
    /// The services this adapter serves; the rest of the registry is dropped on arrival.
    pub(super) shard: Shard,
}

#[allow(clippy::large_enum_variant)] // one at a time, on the stack
enum Step {
    Event(RegistryEvent),
    Failed(RegistryError),
    Shutdown,
    /// A virtual IP's quarantine ended: a service waiting for it may move (`--vip-quarantine`).
    Settle,
}

impl Writer {
    pub(super) async fn run<R: Registry>(mut self, registry: R) {
        self.restore().await;
        let mut backoff = Backoff::new();
        loop {
            let mut stream = registry.watch();
            let error = loop {
                let first = self.next(&mut stream, true).await;
                let mut failure = None;
                match first {
                    Step::Shutdown => return,
                    Step::Failed(e) => break e,
                    Step::Event(ev) => self.apply(ev, &mut backoff).await,
                    Step::Settle => {}
                }
                // Collect what else arrives within the coalescing window into one push.
                if !self.coalesce.is_zero() {
                    let deadline = tokio::time::Instant::now() + self.coalesce;
                    loop {
                        let step = tokio::select! {
                            _ = tokio::time::sleep_until(deadline) => break,
                            step = self.next(&mut stream, false) => step,
                        };
                        match step {
                            Step::Shutdown => return,
                            Step::Failed(e) => {
                                failure = Some(e);
                                break;
                            }
                            Step::Event(ev) => self.apply(ev, &mut backoff).await,
                            Step::Settle => {}
                        }
                    }
                }
                self.publish().await;
                if let Some(e) = failure {
                    break e;
                }
            };
            self.watch_failed(&error).await;
            let delay = backoff.failed(Instant::now());
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// Applies one event. A `Reset` is the watch's full state: the registry is in sync (and the
    /// retry delay may start over once the watch stays up), whatever came before it.
    async fn apply(&mut self, ev: RegistryEvent, backoff: &mut Backoff) {
        match ev {
            RegistryEvent::Reset(_) => {
                backoff.synced(Instant::now());
                self.mark_healthy().await;
            }
            // The watch goes on: health only, nothing to apply.
            RegistryEvent::Retrying(error) => {
                self.metrics
                    .registry_retries
                    .with_label_values(&[error.kind()])
                    .inc();
                self.mark_unhealthy(
                    &error,
                    "Registry watch failed; it resumes by itself from where it was.",
                );
                self.health
                    .set_service_status(REGISTRY_HEALTH, tonic_health::ServingStatus::NotServing)
                    .await;
                return;
            }
            RegistryEvent::Recovered => {
                self.mark_healthy().await;
                return;
            }
            _ => {}
        }
        if let Some(ev) = self.shard.filter(ev) {
            self.index.apply(ev);
        }
    }

    /// The next step; with `settle`, also the end of a virtual IP's quarantine (not within a
    /// coalescing window, which publishes anyway).
    async fn next(
        &self,
        stream: &mut futures::stream::BoxStream<'static, Result<RegistryEvent, RegistryError>>,
        settle: bool,
    ) -> Step {
        let settle = settle
            .then(|| self.index.next_vip_deadline().map(Instant::from_std))
            .flatten();
        tokio::select! {
            _ = self.shutdown.cancelled() => Step::Shutdown,
            _ = tokio::time::sleep_until(settle.unwrap_or_else(Instant::now)), if settle.is_some() => Step::Settle,
            item = stream.next() => match item {
                Some(Ok(ev)) => Step::Event(ev),
                Some(Err(e)) => Step::Failed(e),
                None => Step::Failed(RegistryError::Ended),
            }
        }
    }

    /// `--state-file`: serves the set saved by an earlier run until the registry answers, so an
    /// adapter restarted during a registry outage is not empty (and not unready).
    /// The virtual IP quarantine saved with it is restored too, before the registry's first
    /// set is placed: a restart during a quarantine does not hand the address over.
    async fn restore(&mut self) {
        let mut newest: Option<SystemTime> = None;
        let mut snapshots = Vec::new();
        let mut vips = Vec::new();
        for (shard, path) in self.state_files.iter().enumerate() {
            match state_file::load(path) {
                Ok(Some(saved)) => {
                    let written = std::fs::metadata(path).and_then(|m| m.modified()).ok();
                    tracing::info!(
                        path = %path.display(),
                        shard,
                        version = %saved.snapshot.version,
                        resources = saved.snapshot.len(),
                        vip_quarantine = saved.vip_quarantine.len(),
                        "Serving the state saved by an earlier run until the registry answers."
                    );
                    newest = newest.max(written);
                    snapshots.push((shard, saved.snapshot));
                    // Every shard's file holds the whole quarantine; one that was written
                    // later may know a later end ([`Index::restore_vip_quarantine`] keeps it).
                    vips.extend(saved.vip_quarantine);
                }
                Ok(None) => {
                    tracing::info!(path = %path.display(), shard, "No state file yet; it is written at every change.");
                }
                Err(e) => {
                    tracing::warn!(error = %e, shard, "Ignoring the state file; waiting for the registry.");
                }
            }
        }
        if snapshots.is_empty() {
            return;
        }
        let kept =
            self.index
                .restore_vip_quarantine(&vips, SystemTime::now(), std::time::Instant::now());
        if kept > 0 {
            tracing::info!(
                addresses = kept,
                "Virtual IPs still in quarantine from the earlier run: kept from other services."
            );
        }
        // Shared before the snapshots, so the saver writes the restored set back with it.
        self.update_debug();
        for (shard, snapshot) in snapshots {
            self.snapshots[shard].send_replace(Some(Arc::new(snapshot)));
        }
        {
            let mut st = self.status.lock();
            st.restored = true;
            st.last_good = newest;
        }
        self.health
            .set_service_status("", tonic_health::ServingStatus::Serving)
            .await;
    }

    async fn publish(&mut self) {
        let first = !self.status.lock().synced;
        if !self.index.has_pending() && !first {
            self.update_debug();
            return;
        }
        let published = self.index.flush_shards();
        let sharded = published.len() > 1;
        let mut any = false;
        for (shard, (snapshot, tx)) in published.into_iter().zip(&self.snapshots).enumerate() {
            let Some(snapshot) = snapshot else {
                continue;
            };
            any = true;
            tracing::info!(
                shard,
                version = %snapshot.version,
                resources = snapshot.len(),
                "Publishing a new served set."
            );
            self.metrics
                .snapshots
                .with_label_values(&[if first { "initial" } else { "change" }])
                .inc();
            if sharded {
                let label = shard.to_string();
                self.metrics
                    .shard_snapshots
                    .with_label_values(&[&label])
                    .inc();
                self.metrics
                    .shard_resources
                    .with_label_values(&[&label])
                    .set(snapshot.len() as i64);
            }
            tx.send_replace(Some(snapshot));
        }
        if any && first {
            {
                let mut st = self.status.lock();
                st.synced = true;
                st.restored = false;
            }
            self.health
                .set_service_status("", tonic_health::ServingStatus::Serving)
                .await;
            tracing::info!("First sync from the registry done; serving.");
        }
        self.update_debug();
    }

    /// Brings the status and the state files' virtual IP quarantine up to date.
    fn update_debug(&self) {
        let vips = self.index.vip_quarantine(std::time::Instant::now());
        // Only a quarantine that began (or changed) makes the savers write: one that ended
        // alone is no reason to write the whole set again (a load drops it). Both lists are in
        // address order.
        self.vip_quarantine.send_if_modified(|shared| {
            let began = vips.iter().any(|v| {
                shared
                    .binary_search_by_key(&v.address, |s| s.address)
                    .map_or(true, |i| shared[i] != *v)
            });
            if began {
                *shared = Arc::from(vips.as_slice());
            }
            began
        });
        let mut st = self.status.lock();
        st.quarantine = self.index.quarantine().to_vec();
        st.problems = self.index.problems().clone();
        st.vip_quarantine = vips;
    }

    async fn mark_healthy(&self) {
        {
            let mut st = self.status.lock();
            if st.healthy {
                return;
            }
            if st.last_error.is_some() {
                tracing::info!("Registry is back; in sync again.");
            }
            st.healthy = true;
            st.last_error = None;
        }
        self.metrics.registry_healthy.set(1);
        self.health
            .set_service_status(REGISTRY_HEALTH, tonic_health::ServingStatus::Serving)
            .await;
    }

    /// A watch that ended: counted, and the registry is unhealthy until the next `Reset`.
    async fn watch_failed(&self, error: &RegistryError) {
        self.metrics
            .registry_errors
            .with_label_values(&[error.kind()])
            .inc();
        self.mark_unhealthy(error, "Registry watch failed; retrying with backoff.");
        self.health
            .set_service_status(REGISTRY_HEALTH, tonic_health::ServingStatus::NotServing)
            .await;
    }

    fn mark_unhealthy(&self, error: &RegistryError, message: &'static str) {
        self.metrics.registry_healthy.set(0);
        // Cut where it is stored: /readyz quotes it at every probe (clip.rs).
        let text = clip_error(error.to_string());
        let mut st = self.status.lock();
        if st.healthy || st.last_good.is_none() {
            st.last_good = Some(SystemTime::now());
        }
        st.healthy = false;
        tracing::warn!(error = %text, serving_last_good = st.synced, "{message}");
        st.last_error = Some(text);
    }
}
