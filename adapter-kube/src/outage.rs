//! Which watchers are retrying after a transient error, and when the API server answers again.
//!
//! A watcher that resumes from its resource version says nothing when it succeeds: the watch
//! simply starts again, and events come only when objects change. In a quiet cluster the
//! adapter would stay "unhealthy" for as long as nothing changes. So while any watcher is
//! failing, a probe per failing watcher (a list of at most one object of its resource and scope,
//! with the adapter's own credentials) asks whether the API server answers again; the first
//! probe waits a second, later ones back off to ten. An event from a watcher answers for it too.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;

/// One list request of at most one object of a watcher's resource and scope.
pub type Probe = Arc<dyn Fn() -> BoxFuture<'static, Result<(), kube::Error>> + Send + Sync>;

/// A probe that lists at most one object's metadata through `api`.
pub fn probe<K>(api: kube::Api<K>) -> Probe
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    Arc::new(move || {
        let api = api.clone();
        async move {
            api.list_metadata(&kube::api::ListParams::default().limit(1))
                .await
                .map(|_| ())
        }
        .boxed()
    })
}

const FIRST_PROBE: Duration = Duration::from_secs(1);
const MAX_PROBE_DELAY: Duration = Duration::from_secs(10);
/// A probe that hangs (a half-open connection) counts as no answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The failing watchers (by index) and the probe round under way.
pub struct Outage {
    probes: Vec<Probe>,
    failing: BTreeSet<usize>,
    round: Option<BoxFuture<'static, Vec<usize>>>,
    delay: Duration,
}

impl Outage {
    /// No watcher failing; `probes[i]` probes watcher `i`.
    pub fn new(probes: Vec<Probe>) -> Self {
        Self {
            probes,
            failing: BTreeSet::new(),
            round: None,
            delay: FIRST_PROBE,
        }
    }

    /// Watcher `i` failed.
    pub fn failed(&mut self, i: usize) {
        self.failing.insert(i);
    }

    /// Watcher `i` answered (an event, or its probe). True when that ended the outage.
    pub fn answered(&mut self, i: usize) -> bool {
        if !self.failing.remove(&i) {
            return false;
        }
        let over = self.failing.is_empty();
        if over {
            self.round = None;
            self.delay = FIRST_PROBE;
        }
        over
    }

    /// Any watcher failing.
    pub fn is_on(&self) -> bool {
        !self.failing.is_empty()
    }

    /// Waits for the next probe round and returns the watchers whose probe answered. Safe to
    /// drop and call again: the round under way is kept.
    pub async fn next_round(&mut self) -> Vec<usize> {
        let round = self.round.get_or_insert_with(|| {
            let probes: Vec<(usize, Probe)> = self
                .failing
                .iter()
                .filter_map(|&i| Some((i, Arc::clone(self.probes.get(i)?))))
                .collect();
            let delay = self.delay;
            async move {
                tokio::time::sleep(delay).await;
                let mut answered = Vec::new();
                for (i, probe) in probes {
                    match tokio::time::timeout(PROBE_TIMEOUT, probe()).await {
                        Ok(Ok(())) => answered.push(i),
                        Ok(Err(e)) => tracing::debug!(watcher = i, error = %e, "probe failed"),
                        Err(_) => tracing::debug!(watcher = i, "probe timed out"),
                    }
                }
                answered
            }
            .boxed()
        });
        let answered = round.await;
        self.round = None;
        self.delay = (self.delay * 2).min(MAX_PROBE_DELAY);
        answered
    }
}
