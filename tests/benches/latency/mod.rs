//! What the latency benches share: histograms of microseconds, their quantiles in milliseconds,
//! report lines, and summaries of small samples. Each bench uses part of it.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// An empty histogram of microseconds, three significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::<u64>::new(3).expect("histogram")
}

/// Records `d` in `h` (in microseconds).
pub fn record(h: &mut Histogram<u64>, d: Duration) {
    h.record(d.as_micros() as u64).expect("record");
}

/// A histogram of `samples`.
pub fn histogram_of(samples: &[Duration]) -> Histogram<u64> {
    let mut h = histogram();
    for d in samples {
        record(&mut h, *d);
    }
    h
}

/// Quantile `q` of `h`, in milliseconds.
pub fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

/// Quantile `q` of `ours` over the same quantile of `floor` (at least 1 µs).
pub fn ratio(ours: &Histogram<u64>, floor: &Histogram<u64>, q: f64) -> f64 {
    ours.value_at_quantile(q) as f64 / floor.value_at_quantile(q).max(1) as f64
}

/// `p50 R.RRx, p99 R.RRx`: [`ratio`] at the median and the 99th percentile.
pub fn p50_p99_ratios(ours: &Histogram<u64>, floor: &Histogram<u64>) -> String {
    format!(
        "p50 {:.2}x, p99 {:.2}x",
        ratio(ours, floor, 0.5),
        ratio(ours, floor, 0.99)
    )
}

/// One report line: `what` (padded to `width`), the count, p50, p90, p99 and max in ms.
pub fn print_quantiles(width: usize, what: &str, h: &Histogram<u64>) {
    println!(
        "{what:<width$} n={:<4} p50={:>7.2}ms p90={:>7.2}ms p99={:>7.2}ms max={:>7.2}ms",
        h.len(),
        ms(h, 0.5),
        ms(h, 0.9),
        ms(h, 0.99),
        h.max() as f64 / 1000.0
    );
}

/// Milliseconds from `from` to `to` (0 when `to` is earlier).
pub fn ms_between(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64() * 1000.0
}

/// A small sample's minimum, median, mean and maximum.
pub struct Summary {
    pub min: f64,
    pub p50: f64,
    pub mean: f64,
    pub max: f64,
}

/// The summary of `samples` (not empty), which it sorts.
pub fn summary(samples: &mut [f64]) -> Summary {
    samples.sort_by(f64::total_cmp);
    Summary {
        min: samples[0],
        p50: samples[samples.len() / 2],
        mean: samples.iter().sum::<f64>() / samples.len() as f64,
        max: samples[samples.len() - 1],
    }
}
