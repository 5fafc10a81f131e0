//! The delay before a failed registry watch is started again.
//!
//! Exponential (100 ms doubling to 30 s) with jitter, so that many adapters cut off by one
//! registry outage do not come back in lockstep. The delay goes back to its minimum only when a
//! watch has delivered a full state (`Reset`) *and* stayed up for [`Backoff::STABLE`] after it
//! (like kube-runtime's reset-timer backoff): a watch that fails right after every re-list keeps
//! backing off instead of re-listing a large registry ten times a second, and one that ran fine
//! for a while starts its next recovery quickly.
//!
//! [`Backoff::doubling`] makes the same doubling with other bounds and no jitter, for retries of
//! one item among many (one service of a registry): those fail at their own times already, and
//! the delay an operator is told is the one that is waited.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use tokio::time::Instant;

/// Backoff state of one watch loop.
#[derive(Debug)]
pub struct Backoff {
    next: Duration,
    /// When the running watch delivered its full state.
    synced_at: Option<Instant>,
    /// First delay, and the delay after a reset.
    first: Duration,
    /// Longest delay.
    max: Duration,
    /// Whether delays are spread (see [`jitter`]) or exact.
    jitter: bool,
    /// Failures since the delay last started over.
    failures: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

impl Backoff {
    /// First delay.
    pub const MIN: Duration = Duration::from_millis(100);
    /// Longest delay.
    pub const MAX: Duration = Duration::from_secs(30);
    /// How long a watch must stay up after its full state for the delay to start over.
    pub const STABLE: Duration = Duration::from_secs(10);

    /// A fresh backoff at [`Backoff::MIN`].
    pub fn new() -> Self {
        Self {
            jitter: true,
            ..Self::doubling(Self::MIN, Self::MAX)
        }
    }

    /// A fresh backoff that waits exactly `first`, then twice as long after each failure up to
    /// `max`, without jitter. It starts over like [`Backoff::new`] when [`Backoff::synced`] is
    /// used; otherwise only a new backoff starts over.
    pub fn doubling(first: Duration, max: Duration) -> Self {
        Self {
            next: first,
            synced_at: None,
            first,
            max,
            jitter: false,
            failures: 0,
        }
    }

    /// Failures since the delay last started over (the calls to [`Backoff::failed`]).
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The running watch delivered a full state at `now` (only the first one per watch counts).
    pub fn synced(&mut self, now: Instant) {
        self.synced_at.get_or_insert(now);
    }

    /// The running watch failed at `now`: how long to wait before the next one.
    pub fn failed(&mut self, now: Instant) -> Duration {
        if let Some(at) = self.synced_at.take() {
            if now.saturating_duration_since(at) >= Self::STABLE {
                self.next = self.first;
                self.failures = 0;
            }
        }
        self.failures = self.failures.saturating_add(1);
        let base = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        if self.jitter {
            jitter(base)
        } else {
            base
        }
    }
}

/// A random delay in `[d/2, d]`: spreads retries while keeping the expected growth.
fn jitter(d: Duration) -> Duration {
    let half = d / 2;
    let span = u64::try_from(half.as_micros()).unwrap_or(u64::MAX).max(1);
    half + Duration::from_micros(random_u64() % (span + 1))
}

/// A random number without a dependency: the standard library seeds every `RandomState` from
/// the OS once and then varies it per instance; good enough to spread retries.
fn random_u64() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u64(0x9e37_79b9_7f4a_7c15);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn within(d: Duration, base: Duration) -> bool {
        d >= base / 2 && d <= base
    }

    #[test]
    fn grows_to_the_cap_with_jitter() {
        let now = Instant::now();
        let mut b = Backoff::new();
        let mut base = Backoff::MIN;
        for _ in 0..12 {
            let d = b.failed(now);
            assert!(within(d, base), "{d:?} within [{:?}, {base:?}]", base / 2);
            base = (base * 2).min(Backoff::MAX);
        }
        assert!(within(b.failed(now), Backoff::MAX));
    }

    #[test]
    fn resets_after_a_watch_stayed_up_after_its_full_state() {
        let t0 = Instant::now();
        let mut b = Backoff::new();
        for _ in 0..8 {
            b.failed(t0);
        }
        b.synced(t0);
        // More full states while up do not move the start of the stable period.
        b.synced(t0 + Duration::from_secs(9));
        let d = b.failed(t0 + Backoff::STABLE);
        assert!(within(d, Backoff::MIN), "{d:?}");
    }

    #[test]
    fn a_watch_that_fails_right_after_its_full_state_keeps_backing_off() {
        let t0 = Instant::now();
        let mut b = Backoff::new();
        let mut last = Duration::ZERO;
        for i in 0..6u32 {
            let at = t0 + Duration::from_secs(u64::from(i) * 60);
            b.synced(at);
            last = b.failed(at + Duration::from_millis(500));
        }
        assert!(
            last >= Backoff::MIN * 16,
            "still growing after six quick failures: {last:?}"
        );
    }

    #[test]
    fn doubling_is_exact_and_counts_failures() {
        let now = Instant::now();
        let first = Duration::from_millis(500);
        let max = Duration::from_secs(30);
        let mut b = Backoff::doubling(first, max);
        let delays: Vec<_> = (0..8).map(|_| b.failed(now)).collect();
        let secs = |s: f64| Duration::from_secs_f64(s);
        let want = [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0].map(secs);
        assert_eq!(delays, want);
        assert_eq!(b.failures(), 8);
        assert_eq!(Backoff::new().failures(), 0);
    }

    #[test]
    fn jitter_varies() {
        let ds: std::collections::BTreeSet<_> =
            (0..20).map(|_| jitter(Duration::from_secs(10))).collect();
        assert!(ds.len() > 1, "{ds:?}");
    }
}
