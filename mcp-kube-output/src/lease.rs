//! One writer among replicas: a `coordination.k8s.io/v1` Lease, as Kubernetes controllers hold
//! theirs. Every replica serves MCP; only the Lease's holder writes objects. Followers watch the
//! Lease and take over when its holder stops renewing it (expiry is judged by when this replica
//! last saw the Lease change, never by comparing clocks across machines).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::Client;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::client::status_code;
use crate::metrics::OutputMetrics;
use crate::SharedOutputStatus;
use mcp_core::clip::clip_error;

/// How long a Lease holds without renewal (client-go's default).
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How often the holder renews and followers look (client-go's retry period).
pub const RETRY_PERIOD: Duration = Duration::from_secs(2);
/// A holder that could not renew for this long stops writing (before the Lease can expire and
/// another replica take over).
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);

/// Which Lease, and who this replica is.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// This replica's holder identity.
    pub identity: String,
    /// What this adapter serves (`OutputConfig::fingerprint`).
    pub fingerprint: String,
}

/// What this replica last saw of the Lease: its resourceVersion and when it changed.
#[derive(Debug, Default)]
struct Observed {
    version: Option<String>,
    since: Option<Instant>,
}

/// Holds or follows the Lease until `shutdown`, publishing whether this replica leads; releases
/// it at shutdown so a follower takes over at once.
pub async fn elect(
    client: Client,
    cfg: LeaseConfig,
    leader: watch::Sender<bool>,
    metrics: OutputMetrics,
    status: SharedOutputStatus,
    shutdown: CancellationToken,
) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let mut observed = Observed::default();
    let mut renewed: Option<Instant> = None;
    loop {
        let result = try_acquire_or_renew(&api, &cfg, &mut observed).await;
        let now = Instant::now();
        status.lock().lease_error = result.as_ref().err().map(|e| clip_error(e.to_string()));
        let leads = match result {
            Ok(leads) => {
                if leads {
                    renewed = Some(now);
                }
                leads
            }
            Err(e) => {
                let was = *leader.borrow();
                let within = renewed.is_some_and(|r| now.duration_since(r) < RENEW_DEADLINE);
                tracing::warn!(lease = %cfg.name, namespace = %cfg.namespace, error = %e, leader = was && within, "Cannot read or renew the output's Lease.");
                was && within
            }
        };
        if leads != *leader.borrow() {
            tracing::info!(lease = %cfg.name, namespace = %cfg.namespace, identity = %cfg.identity, leader = leads, "Kubernetes output leadership changed.");
        }
        metrics.kube_leader.set(i64::from(leads));
        leader.send_replace(leads);
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(RETRY_PERIOD) => {}
        }
    }
    if *leader.borrow() {
        leader.send_replace(false);
        if let Err(e) = release(&api, &cfg).await {
            tracing::warn!(lease = %cfg.name, error = %e, "Could not release the output's Lease; a follower takes over when it expires.");
        }
    }
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

fn duration_secs() -> i32 {
    LEASE_DURATION.as_secs() as i32
}

async fn try_acquire_or_renew(
    api: &Api<Lease>,
    cfg: &LeaseConfig,
    observed: &mut Observed,
) -> Result<bool, kube::Error> {
    let Some(mut lease) = api.get_opt(&cfg.name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(cfg.name.clone()),
                namespace: Some(cfg.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(cfg.identity.clone()),
                lease_duration_seconds: Some(duration_secs()),
                acquire_time: Some(now()),
                renew_time: Some(now()),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        return lost_race_is_follow(api.create(&PostParams::default(), &lease).await);
    };
    let at = Instant::now();
    if observed.version != lease.metadata.resource_version {
        observed.version = lease.metadata.resource_version.clone();
        observed.since = Some(at);
    }
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder != cfg.identity {
        let held_for = spec
            .lease_duration_seconds
            .map_or(LEASE_DURATION, |s| Duration::from_secs(s.max(1) as u64));
        let expired = observed
            .since
            .is_none_or(|s| at.duration_since(s) >= held_for);
        if !holder.is_empty() && !expired {
            return Ok(false);
        }
        spec.holder_identity = Some(cfg.identity.clone());
        spec.acquire_time = Some(now());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.renew_time = Some(now());
    spec.lease_duration_seconds = Some(duration_secs());
    // The resourceVersion in `lease` makes this a compare-and-swap: two replicas taking an
    // expired Lease at once cannot both win.
    lost_race_is_follow(api.replace(&cfg.name, &PostParams::default(), &lease).await)
}

/// A 409 (someone else created or changed the Lease first) means: follow.
fn lost_race_is_follow(r: Result<Lease, kube::Error>) -> Result<bool, kube::Error> {
    match r {
        Ok(_) => Ok(true),
        Err(e) if status_code(&e) == Some(409) => Ok(false),
        Err(e) => Err(e),
    }
}

async fn release(api: &Api<Lease>, cfg: &LeaseConfig) -> Result<(), kube::Error> {
    let Some(mut lease) = api.get_opt(&cfg.name).await? else {
        return Ok(());
    };
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    if spec.holder_identity.as_deref() != Some(cfg.identity.as_str()) {
        return Ok(());
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(now());
    api.replace(&cfg.name, &PostParams::default(), &lease)
        .await
        .map(|_| ())
}

/// This replica's default identity: `POD_NAME` (or the host name), the pid and a random suffix.
pub fn default_identity() -> String {
    let host = std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .unwrap_or_else(|| "adapter".into());
    format!("{host}-{}-{}", std::process::id(), random_suffix())
}

/// Five random characters: two containers with `hostNetwork` share the host name and both can be
/// pid 1, and two replicas of one identity would both believe they hold the Lease.
fn random_suffix() -> String {
    use std::hash::{BuildHasher, Hasher};
    // The standard library keys `RandomState`s from the system's random source (per process,
    // then a different key for each one made).
    let mut n = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (0..5)
        .map(|_| {
            let c = b"bcdfghjklmnpqrstvwxz2456789"[(n % 27) as usize];
            n /= 27;
            char::from(c)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_identities_of_one_host_and_pid_differ() {
        let (a, b) = (default_identity(), default_identity());
        assert_ne!(a, b);
        let pid = format!("-{}-", std::process::id());
        for id in [&a, &b] {
            let (_, suffix) = id.rsplit_once(&pid).expect("host-pid-suffix");
            assert_eq!(suffix.len(), 5, "{id}");
            assert!(suffix.bytes().all(|c| c.is_ascii_alphanumeric()), "{id}");
        }
    }
}
