//! The Kubernetes output (`--output kube|both`): the served set written into a cluster as
//! `networking.istio.io/v1` ServiceEntry objects, beside (or instead of) MCP.
//!
//! Why: since Istio 1.22 the ambient index that feeds ztunnel and binds waypoints reads
//! ServiceEntries only from Kubernetes informers, never from `configSources`; a service that
//! reaches istiod only over MCP is invisible to ambient. ServiceEntries (not WorkloadEntries):
//! one object per served service, endpoints inline, exactly the resource MCP sends, so a change
//! costs one request per changed service and both outputs show the same spec.
//!
//! Shape: the output reads the same per-shard snapshots the MCP ports serve (so it gets the same
//! coalescing), and `sync` makes the API server hold them: a metadata-only list when it starts
//! leading (and every `--output-resync`) says what is there, `plan` compares by entry version,
//! each request goes through the `limiter`, and only the `lease` holder writes. It never writes
//! before the registry's first sync (a set restored from `--state-file` may be old) and never
//! touches an object without its ownership labels.
//!
//! Depends on `mcp-core` (the snapshots, the ServiceEntry's names and labels) and kube; must
//! never depend on the gRPC server or the runtime. Its settings come in as an [`OutputConfig`]
//! (the runtime's flags build it), its state goes out through a [`SharedOutputStatus`].

mod client;
#[cfg(test)]
mod fake_api;
mod lease;
mod limiter;
mod list;
pub mod metrics;
mod object;
mod plan;
mod send;
mod sync;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use client::{connect, ClientError};
pub use lease::LeaseConfig;
pub use object::{Owner, ANNOTATION_VERSION, FIELD_MANAGER, LABEL_SHARD, MANAGED_BY};
pub use plan::Rejected;

use crate::metrics::OutputMetrics;
use mcp_core::cache::Snapshot;

/// Where the output writes and how fast (`--output-*`).
#[derive(Clone, Debug)]
pub struct OutputConfig {
    /// Kubeconfig of the output's cluster (else in-cluster, then the default kubeconfig).
    pub kubeconfig: Option<PathBuf>,
    /// Its context.
    pub context: Option<String>,
    /// The namespaces it may write (empty: any).
    pub namespaces: Vec<String>,
    /// The Lease's namespace (else the first output namespace, else the adapter's).
    pub lease_namespace: Option<String>,
    /// This replica's identity in the Lease (else host name and a random suffix).
    pub identity: Option<String>,
    /// Requests per second to the API server.
    pub qps: f64,
    /// Requests allowed at once above the rate.
    pub burst: u32,
    /// How often the API server's objects are listed again (drift repair).
    pub resync: Duration,
    /// What this adapter serves, as a fingerprint of its flags: replicas share it, another
    /// adapter with the same ownership labels does not (kept on the Lease).
    pub fingerprint: String,
    /// The same without the shard layout: written on every object, so that the same adapter
    /// in another layout takes over its objects once their Lease has no holder.
    pub objects_fingerprint: String,
}

/// Whether the registry has synced once (the runtime knows; the output never writes before).
pub type RegistrySynced = Arc<dyn Fn() -> bool + Send + Sync>;

/// What the output reports on `/readyz`, `/registryz` and `/debug/resources`.
#[derive(Clone, Debug, Default)]
pub struct OutputStatus {
    /// This replica holds the Lease and writes.
    pub leader: bool,
    /// The Lease has been looked at once (until then, who holds it is not known).
    pub lease_looked: bool,
    /// The Lease (`namespace/name`) and this replica's identity in it.
    pub lease: String,
    /// This replica's identity.
    pub identity: String,
    /// The API server holds the newest served set (as leader).
    pub in_step: bool,
    /// This adapter's objects in the API server.
    pub objects: usize,
    /// Objects still to write or delete.
    pub pending: usize,
    /// Since when the API server is behind the served set.
    pub behind_since: Option<SystemTime>,
    /// The last failure to write to the API server, while it lasts.
    pub last_error: Option<String>,
    /// The last failure to read or renew the Lease, while it lasts (no replica may be writing).
    pub lease_error: Option<String>,
    /// Served names held by an object that is not this adapter's.
    pub conflicts: Vec<String>,
    /// Served names outside `--output-namespaces`.
    pub refused: Vec<String>,
    /// Objects the API server refused, by name.
    pub rejected: BTreeMap<String, Rejected>,
    /// Other adapters writing objects with this adapter's ownership labels under a Lease of
    /// their own (seen on the objects): their objects are left alone.
    pub owner_conflicts: Vec<OwnerConflict>,
    /// Output namespaces that cannot be listed (403, 404), with the API server's answer: their
    /// names are neither written nor deleted; the other namespaces go on.
    pub unreadable: BTreeMap<String, String>,
    /// This adapter's Lease is held by a replica configured differently (another adapter with
    /// the same registry, source and shard): this one does not write.
    pub lease_conflict: Option<String>,
}

/// Another adapter claiming this adapter's objects: seen on objects that carry this adapter's
/// ownership labels but name another Lease, whose holder is alive.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnerConflict {
    /// The other Lease, `namespace/name`.
    pub lease: String,
    /// Its holder.
    pub holder: String,
    /// How many objects name it.
    pub objects: usize,
}

/// Shared [`OutputStatus`]: the output writes it, the admin endpoints read it; the lock is never
/// held across an await.
#[derive(Clone, Debug, Default)]
pub struct SharedOutputStatus(Arc<Mutex<OutputStatus>>);

impl SharedOutputStatus {
    /// Locks it (a poisoned lock still holds a consistent status: every update is one assignment).
    pub fn lock(&self) -> MutexGuard<'_, OutputStatus> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl OutputStatus {
    /// Seconds the API server is behind the served set (0 in step).
    pub fn lag_secs(&self) -> f64 {
        self.behind_since
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .map_or(0.0, |d| d.as_secs_f64())
    }

    /// The output cannot do its job: the leader cannot write, or the Lease cannot be reached.
    pub fn failing(&self) -> bool {
        self.lease_error.is_some()
            || self.lease_conflict.is_some()
            || !self.owner_conflicts.is_empty()
            || (self.leader && !self.unreadable.is_empty())
            || (self.leader && self.last_error.is_some())
    }

    /// One line for people: leadership, and how far behind.
    pub fn summary(&self) -> String {
        if let Some(c) = &self.lease_conflict {
            return format!("kube output: not writing: {c}");
        }
        if let (false, Some(e)) = (self.leader, &self.lease_error) {
            return format!(
                "kube output: not writing: cannot read or renew the Lease {} ({e})",
                self.lease
            );
        }
        if !self.leader && !self.lease_looked {
            return format!(
                "kube output: starting (Lease {} not looked at yet)",
                self.lease
            );
        }
        if !self.leader {
            return format!(
                "kube output: following (Lease {} held by another replica)",
                self.lease
            );
        }
        let mut s = if self.in_step {
            format!(
                "kube output: leader, API server in step ({} objects)",
                self.objects
            )
        } else {
            format!(
                "kube output: leader, API server {} objects behind for {:.1}s",
                self.pending,
                self.lag_secs()
            )
        };
        if let Some(e) = &self.last_error {
            s.push_str(&format!(" (last error: {e})"));
        }
        // A leader that cannot renew its Lease fails (/registryz 503) before it stops writing
        // at the renew deadline: the line says why.
        if let Some(e) = &self.lease_error {
            s.push_str(&format!(
                "; cannot renew the Lease {} ({e}): writing stops at its deadline",
                self.lease
            ));
        }
        if !self.conflicts.is_empty() {
            s.push_str(&format!(
                "; {} names held by objects not ours, left alone",
                self.conflicts.len()
            ));
        }
        if !self.rejected.is_empty() {
            s.push_str(&format!(
                "; {} objects refused by the API server",
                self.rejected.len()
            ));
        }
        for (ns, e) in &self.unreadable {
            s.push_str(&format!(
                "; cannot list namespace {ns}, its objects wait ({e})"
            ));
        }
        for c in &self.owner_conflicts {
            s.push_str(&format!(
                "; another adapter claims this one's objects: {} objects written under Lease {} (held by {}), left alone (give one of them another --source-name)",
                c.objects, c.lease, c.holder
            ));
        }
        s
    }

    /// `/debug/resources`' `kubeOutput` section, with at most `limit` names in each list (every
    /// served name can be in one); whether a list was cut.
    pub fn to_json(&self, limit: usize) -> (serde_json::Value, bool) {
        let cut = [
            self.conflicts.len(),
            self.refused.len(),
            self.rejected.len(),
        ]
        .into_iter()
        .any(|n| n > limit);
        let rejected: BTreeMap<&String, &Rejected> = self.rejected.iter().take(limit).collect();
        let json = serde_json::json!({
            "leader": self.leader,
            "lease": self.lease,
            "identity": self.identity,
            "inStep": self.in_step,
            "objects": self.objects,
            "pending": self.pending,
            "lagSeconds": self.lag_secs(),
            "lastError": self.last_error,
            "leaseError": self.lease_error,
            "conflicts": &self.conflicts[..self.conflicts.len().min(limit)],
            "refused": &self.refused[..self.refused.len().min(limit)],
            "rejected": rejected,
            "ownerConflicts": self.owner_conflicts,
            "leaseConflict": self.lease_conflict,
            "unreadable": self.unreadable,
        });
        (json, cut)
    }
}

/// Why the output could not start.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// No client for the output's cluster.
    #[error("--output kube: {0}")]
    Client(#[from] ClientError),
}

/// Everything the output needs from the runtime.
pub struct OutputParts {
    /// Registry type (`mcp-adapter/registry`).
    pub registry: &'static str,
    /// `--source-name`.
    pub source: String,
    /// The adapter's `--namespace` (the Lease's default namespace).
    pub namespace: String,
    /// `--shard i/n` of this process, as `(i, n)`.
    pub only_shard: Option<(usize, usize)>,
    /// The served set, per shard.
    pub snapshots: Vec<watch::Receiver<Option<Arc<Snapshot>>>>,
    /// The output's status (it writes it).
    pub status: SharedOutputStatus,
    /// Whether the registry has synced once.
    pub registry_synced: RegistrySynced,
    /// Metrics.
    pub metrics: OutputMetrics,
    /// Stops it.
    pub shutdown: CancellationToken,
}

/// Connects to the output's cluster and returns its two tasks: the Lease and the writer.
pub async fn start(
    args: &OutputConfig,
    parts: OutputParts,
) -> Result<
    (
        impl std::future::Future<Output = ()>,
        impl std::future::Future<Output = ()>,
    ),
    OutputError,
> {
    let client = connect(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
    let shard_suffix = parts
        .only_shard
        .map(|(i, n)| format!("-shard-{i}-of-{n}"))
        .unwrap_or_default();
    let owner = Owner::new(
        parts.registry,
        &parts.source,
        parts.only_shard.map(|(i, n)| object::shard_label(i, n)),
    );
    let lease_name = format!("mcp-adapter-{}{shard_suffix}", owner.source);
    let lease_namespace = args
        .lease_namespace
        .clone()
        .or_else(|| args.namespaces.first().cloned())
        .unwrap_or_else(|| parts.namespace.clone());
    let lease = LeaseConfig {
        namespace: lease_namespace.clone(),
        name: lease_name.clone(),
        identity: args
            .identity
            .clone()
            .unwrap_or_else(lease::default_identity),
        fingerprint: args.fingerprint.clone(),
    };
    let shards = parts.snapshots.len();
    let shard_labels: Vec<Option<String>> = (0..shards)
        .map(|i| match parts.only_shard {
            Some((index, count)) => Some(object::shard_label(index, count)),
            None if shards > 1 => Some(object::shard_label(i, shards)),
            None => None,
        })
        .collect();
    *parts.status.lock() = OutputStatus {
        lease: format!("{}/{}", lease.namespace, lease.name),
        identity: lease.identity.clone(),
        ..OutputStatus::default()
    };
    tracing::info!(
        lease = %format!("{}/{}", lease.namespace, lease.name),
        identity = %lease.identity,
        namespaces = ?args.namespaces,
        selector = %owner.selector(),
        "Kubernetes output on: writing ServiceEntry objects while holding the Lease."
    );
    let (leader_tx, leader_rx) = watch::channel(false);
    let elect = lease::elect(
        client.clone(),
        lease,
        leader_tx,
        parts.metrics.clone(),
        parts.status.clone(),
        parts.shutdown.clone(),
    );
    let writer = sync::ObjectWriter {
        client,
        owner,
        stamp: object::Stamp {
            lease: format!("{lease_namespace}/{lease_name}"),
            config: args.objects_fingerprint.clone(),
        },
        namespaces: args.namespaces.clone(),
        limiter: limiter::Limiter::new(args.qps, args.burst),
        resync: args.resync,
        snapshots: parts.snapshots,
        shard_labels,
        status: parts.status,
        registry_synced: parts.registry_synced,
        metrics: parts.metrics,
        leader: leader_rx,
        shutdown: parts.shutdown,
        leases_seen: Default::default(),
    };
    Ok((elect, writer.run()))
}
