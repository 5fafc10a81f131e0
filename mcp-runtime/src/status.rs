//! What the admin endpoints report: sync and registry health, quarantine, skipped objects.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use mcp_core::index::{Problems, Quarantined};
use mcp_core::vip::QuarantinedVip;
use mcp_kube_output::SharedOutputStatus;

/// Health of the source as the writer task last saw it.
#[derive(Clone, Debug, Default)]
pub struct Status {
    /// The first full sync from the registry is done.
    pub synced: bool,
    /// Serving a set restored from `--state-file` (until the first sync replaces it).
    pub restored: bool,
    /// The registry is reachable and in sync.
    pub healthy: bool,
    /// The last registry error, while unhealthy.
    pub last_error: Option<String>,
    /// When the registry was last known in sync (set when it became unhealthy).
    pub last_good: Option<SystemTime>,
    /// Services not served as described.
    pub quarantine: Vec<Quarantined>,
    /// Registry objects skipped as bad data.
    pub problems: Problems,
    /// Virtual IPs in quarantine (`--vip-quarantine`), as of the writer's last publish.
    pub vip_quarantine: Vec<QuarantinedVip>,
    /// The Kubernetes output's own status (`--output kube|both`).
    pub output: Option<SharedOutputStatus>,
}

impl Status {
    /// Seconds the served state may be behind the registry (0 while healthy).
    pub fn staleness_secs(&self) -> u64 {
        if self.healthy {
            return 0;
        }
        self.last_good
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .map_or(0, |d| d.as_secs())
    }

    /// Ready = there is a state worth serving: the registry was synced once, or the last served
    /// set was restored from `--state-file`. A registry outage
    /// after that does not make the adapter unready: it keeps serving the last good state,
    /// which is exactly what a (re)starting istiod needs to reach. Registry health is
    /// [`Status::healthy`] (`/registryz`, the `registry` gRPC health service, metrics).
    pub fn ready(&self) -> bool {
        self.synced || self.restored
    }
}

/// Shared [`Status`]; the lock is never held across an await.
#[derive(Clone, Debug, Default)]
pub struct SharedStatus(Arc<Mutex<Status>>);

impl SharedStatus {
    /// Locks it (a poisoned lock still holds a consistent status: every update is one assignment).
    pub fn lock(&self) -> MutexGuard<'_, Status> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}
