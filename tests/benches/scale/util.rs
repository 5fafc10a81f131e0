//! Small helpers of the scale bench: clocks, environment knobs, statistics, the adapter's log
//! timestamps, the machine line, and the RNG that spreads the delta phase's writes.

use std::time::{SystemTime, UNIX_EPOCH};

use mcp_core::testing::bench;

/// Nanoseconds since the epoch (the clock the sinks' process and the adapter's log share).
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

pub fn ms_between(from: u64, to: u64) -> f64 {
    (to as f64 - from as f64) / 1e6
}

pub use mcp_core::testing::bench::env_usize;

pub fn env_list(name: &str) -> Option<Vec<usize>> {
    std::env::var(name).ok().map(|v| {
        v.split(',')
            .filter(|p| !p.trim().is_empty())
            .map(|p| {
                p.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}={v}: not a list of numbers"))
            })
            .collect()
    })
}

/// `q`-quantile (nearest rank) of unsorted samples; NaN when empty.
pub fn quantile(samples: &[f64], q: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

pub fn pcts(samples: &[f64]) -> String {
    format!(
        "p50 {:>8.2}  p90 {:>8.2}  p99 {:>8.2}  max {:>8.2} ms (n={})",
        quantile(samples, 0.5),
        quantile(samples, 0.9),
        quantile(samples, 0.99),
        quantile(samples, 1.0),
        samples.len()
    )
}

/// Least-squares slope and intercept of y over x.
pub fn fit(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    if points.len() < 2 {
        return (f64::NAN, points.first().map_or(f64::NAN, |p| p.1));
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = points.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    let slope = sxy / sxx;
    (slope, my - slope * mx)
}

/// Nanoseconds since the epoch of a UTC timestamp as tracing-subscriber prints it
/// (`2026-11-23T15:36:46.107499Z`).
pub fn parse_ts(s: &str) -> Option<u64> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|p| p.parse::<u64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    let digits = frac.len().min(9);
    let frac_ns = frac[..digits].parse::<u64>().ok()? * 10u64.pow((9 - digits) as u32);
    // Days from the civil date (H. Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = u64::try_from(era * 146_097 + doe - 719_468).ok()?;
    Some((days * 86_400 + hh * 3600 + mm * 60 + ss) * 1_000_000_000 + frac_ns)
}

/// Drops ANSI colour sequences (the adapter colours its log even into a file).
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `2 cores (AMD EPYC), 23.5 GiB RAM, load average 0.52 0.58 0.59 at start`.
pub fn machine() -> String {
    let cpu = bench::cpu_model().unwrap_or_else(|| "unknown CPU".into());
    let mem = bench::mem_total_kib().map_or(String::new(), |kib| {
        format!(", {:.1} GiB RAM", kib / 1024.0 / 1024.0)
    });
    format!(
        "{} cores ({cpu}){mem}, load average {} at start",
        bench::cores(),
        bench::load_average()
    )
}
