//! The churn soak with faults (issue #46 item 3): every registry driven at a set rate (services
//! added, changed and removed, instances added and removed, health flipped) by a seeded random
//! generator, faults injected (an adapter SIGKILLed, a registry restarted, connections cut,
//! istiod restarted), and at each quiet point istiod's and Envoy's views compared with what each
//! registry itself holds.
//!
//! - [`drivers`], [`jvm_drivers`]: one driver per registry (writes, and the registry's own
//!   truth read back);
//! - [`faults`]: the fault kinds and their schedule;
//! - [`compare`]: istiod's and Envoy's views, and their differences from the truth;
//! - [`report`]: what the run measured, printed and written as JSON;
//! - [`world`]: everything started, and the run itself.

pub mod compare;
pub mod drivers;
pub mod faults;
pub mod jvm_drivers;
pub mod model;
pub mod report;
pub mod world;

use std::time::Duration;

/// How a soak runs: from the environment (`SOAK_*`), with a short default that the plain test
/// command runs.
#[derive(Clone, Debug)]
pub struct SoakConfig {
    /// How long the registries are driven (startup and the final check come on top).
    pub duration: Duration,
    /// Operations per second, all registries together.
    pub rate: f64,
    /// Mean time between faults (random, exponential) in a long run; in the short run the
    /// faults come one after another, each kind at least once.
    pub fault_every: Duration,
    /// The generator's seed: the same seed drives the same operations.
    pub seed: u64,
    /// The registries driven (`file,consul,kube,zookeeper,eureka,nacos`).
    pub registries: Vec<String>,
    /// Faults scheduled in a fixed order (every kind once) instead of at random.
    pub scheduled: bool,
    /// How long istiod and Envoy get to agree with the registries after a fault heals.
    pub bound: Duration,
    /// Drops one endpoint from the truth at every comparison (`SOAK_BREAK=1`): shows that the
    /// comparison fails when the views differ from the truth.
    pub break_truth: bool,
}

/// Every registry the soak knows, in the order they are driven.
pub const ALL_REGISTRIES: [&str; 6] = ["file", "consul", "kube", "zookeeper", "eureka", "nacos"];

impl SoakConfig {
    /// `SOAK_DURATION` (`90s`, `60m`, `1h`), `SOAK_RATE`, `SOAK_FAULT_EVERY`, `SOAK_SEED`,
    /// `SOAK_REGISTRIES` (comma-separated), `SOAK_BOUND`, `SOAK_BREAK`. Without
    /// `SOAK_DURATION` the short run: 10 ops/s, nine faults one after another 10 s apart (the
    /// run lasts until they are all done).
    pub fn from_env() -> SoakConfig {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let duration = var("SOAK_DURATION").map(|v| parse_duration(&v));
        let scheduled = duration.is_none();
        SoakConfig {
            duration: duration.unwrap_or(Duration::from_secs(60)),
            rate: var("SOAK_RATE")
                .map(|v| v.parse().expect("SOAK_RATE: operations per second"))
                .unwrap_or(10.0),
            fault_every: var("SOAK_FAULT_EVERY")
                .map(|v| parse_duration(&v))
                .unwrap_or(Duration::from_secs(if scheduled { 10 } else { 60 })),
            seed: var("SOAK_SEED")
                .map(|v| v.parse().expect("SOAK_SEED: an unsigned integer"))
                .unwrap_or(46),
            registries: var("SOAK_REGISTRIES")
                .map(|v| {
                    v.split(',')
                        .map(|r| r.trim().to_string())
                        .filter(|r| !r.is_empty())
                        .collect()
                })
                .unwrap_or_else(|| ALL_REGISTRIES.iter().map(|r| r.to_string()).collect()),
            scheduled,
            bound: var("SOAK_BOUND")
                .map(|v| parse_duration(&v))
                .unwrap_or(Duration::from_secs(45)),
            break_truth: var("SOAK_BREAK").is_some_and(|v| v != "0"),
        }
    }
}

/// `90s`, `60m`, `1h`, `500ms`, or plain seconds.
pub fn parse_duration(s: &str) -> Duration {
    let s = s.trim();
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or((s, "s"), |i| s.split_at(i));
    let n: f64 = num
        .parse()
        .unwrap_or_else(|_| panic!("not a duration: {s:?}"));
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        other => panic!("unknown unit {other:?} in {s:?} (ms, s, m, h)"),
    };
    Duration::from_secs_f64(secs)
}

/// SplitMix64 (mcp-core's): small, seedable, and the same sequence on every machine (no crate
/// needed).
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        mcp_core::testing::splitmix64(&mut self.0)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// A number in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// One of `items` (not empty).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("90s"), Duration::from_secs(90));
        assert_eq!(parse_duration("60m"), Duration::from_secs(3600));
        assert_eq!(parse_duration("1h"), Duration::from_secs(3600));
        assert_eq!(parse_duration("500ms"), Duration::from_millis(500));
        assert_eq!(parse_duration("7"), Duration::from_secs(7));
    }

    #[test]
    fn the_generator_repeats_itself() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        let xs: Vec<u64> = (0..5).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..5).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        assert!((0..1000).all(|_| a.below(5) < 5));
    }
}
