//! The client-side rate limit (`--output-qps`, `--output-burst`): a token bucket in front of
//! every request, so a cold start or a registry-wide change is spread out instead of landing on
//! the API server at once (API Priority and Fairness protects the server; this keeps the output
//! from being the one that trips it).

use std::time::Duration;

use tokio::time::Instant;

/// A token bucket: `burst` requests at once, then `qps` per second.
#[derive(Debug)]
pub struct Limiter {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Limiter {
    /// A full bucket.
    pub fn new(qps: f64, burst: u32) -> Limiter {
        let burst = f64::from(burst.max(1));
        Limiter {
            qps,
            burst,
            tokens: burst,
            last: Instant::now(),
        }
    }

    /// Waits until one request may go.
    pub async fn acquire(&mut self) {
        let wait = self.take(Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    /// Takes a token at `now`; how long to wait before using it.
    fn take(&mut self, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst) - 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.qps)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_rate() {
        let start = Instant::now();
        let mut l = Limiter::new(10.0, 3);
        l.last = start;
        for _ in 0..3 {
            assert_eq!(l.take(start), Duration::ZERO);
        }
        // The 4th and 5th wait 100 ms and 200 ms.
        let w4 = l.take(start);
        let w5 = l.take(start);
        assert!((w4.as_secs_f64() - 0.1).abs() < 1e-9, "{w4:?}");
        assert!((w5.as_secs_f64() - 0.2).abs() < 1e-9, "{w5:?}");
        // A second later the debt is paid and 8 more tokens have come (capped at 3).
        let later = start + Duration::from_secs(2);
        for _ in 0..3 {
            assert_eq!(l.take(later), Duration::ZERO);
        }
        assert!(!l.take(later).is_zero());
    }
}
