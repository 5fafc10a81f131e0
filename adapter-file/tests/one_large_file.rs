//! What parsing one large file costs in memory, against the same services in many small files.
//!
//! A CMDB export is often one file. Parsed as one document (the YAML parser's events, then one
//! value tree), 100,000 services in one file peaked at 3.4 GiB where 100 files of 1,000 peaked
//! at well under 1 GiB (BENCHMARKS.md). Here the process's peak resident memory (`VmHWM`, reset
//! through `/proc/self/clear_refs`) is read around each parse: one file of 3,000 services must
//! not cost much more than the same services in 30 files. Memory is counted, not time, so the
//! machine's load does not move it. This file holds one test so no other test runs beside it in
//! this process.

use std::fmt::Write as _;
use std::fs;
use std::ops::Range;
use std::process::Command;

use adapter_file::{parse, Format};

const SERVICES: usize = 3_000;
const PER_FILE: usize = 100;
const MIB: u64 = 1024;

/// A `/proc/self/status` field in KiB.
fn status_kib(field: &str) -> u64 {
    let status = fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"))
}

/// How far `f` raised the resident peak above what was resident before it, in KiB.
fn peak_growth<T>(f: impl FnOnce() -> T) -> (u64, T) {
    // 5: reset the peak resident set size to the current one.
    fs::write("/proc/self/clear_refs", "5").expect("reset VmHWM");
    let before = status_kib("VmRSS");
    let out = f();
    (status_kib("VmHWM").saturating_sub(before), out)
}

/// Services `range` shaped like the scale bench's: ten endpoints, each with three labels and a
/// locality.
fn yaml(range: Range<usize>) -> String {
    let mut out = String::from("kind: Inventory\nnamespace: scale\nservices:\n");
    for i in range {
        let _ = writeln!(
            out,
            "  - name: svc-{i:06}\n    ports: {{http: 8080}}\n    labels: {{team: team-{:02}}}\n    endpoints:",
            i % 40
        );
        for j in 0..10 {
            let e = i * 10 + j;
            let _ = writeln!(
                out,
                "      - {{address: 10.{}.{}.{}, locality: us-east/zone-{}, labels: {{version: v{}, zone: zone-{}, track: stable}}}}",
                (e >> 16) & 255,
                (e >> 8) & 255,
                e & 255,
                j % 3,
                j % 2,
                j % 3
            );
        }
    }
    out
}

/// The same services as JSON.
fn json(range: Range<usize>) -> String {
    let services: Vec<String> = range
        .map(|i| {
            let endpoints: Vec<String> = (0..10)
                .map(|j| {
                    let e = i * 10 + j;
                    format!(
                        r#"{{"address": "10.{}.{}.{}", "locality": "us-east/zone-{}", "labels": {{"version": "v{}", "zone": "zone-{}", "track": "stable"}}}}"#,
                        (e >> 16) & 255,
                        (e >> 8) & 255,
                        e & 255,
                        j % 3,
                        j % 2,
                        j % 3
                    )
                })
                .collect();
            format!(
                r#"{{"name": "svc-{i:06}", "ports": {{"http": 8080}}, "labels": {{"team": "team-{:02}"}}, "endpoints": [{}]}}"#,
                i % 40,
                endpoints.join(", ")
            )
        })
        .collect();
    format!(
        "{{\"kind\": \"Inventory\", \"namespace\": \"scale\", \"services\": [\n{}\n]}}",
        services.join(",\n")
    )
}

/// Set in the child processes that each measure one parse.
const CASE: &str = "ONE_LARGE_FILE_CASE";
const TEST: &str = "one_large_file_costs_what_many_small_files_cost";

/// In a fresh process (memory freed by an earlier parse would be reused and hide a later one's
/// peak): the peak growth of parsing the services as one file, or as many (their services kept,
/// as the adapter keeps them), with the texts already in memory.
fn measure(format: Format, one_file: bool) -> u64 {
    let text = match format {
        Format::Yaml => yaml,
        Format::Json => json,
    };
    let files: Vec<String> = if one_file {
        vec![text(0..SERVICES)]
    } else {
        (0..SERVICES / PER_FILE)
            .map(|f| text(f * PER_FILE..(f + 1) * PER_FILE))
            .collect()
    };
    let (kib, kept) = peak_growth(|| {
        files
            .iter()
            .map(|t| parse("inventory", t, format).expect("the file parses"))
            .collect::<Vec<_>>()
    });
    assert_eq!(kept.iter().map(Vec::len).sum::<usize>(), SERVICES);
    kib
}

/// Runs [`measure`] in a child process of this test binary.
fn measure_apart(format: &str, layout: &str) -> u64 {
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
        .env(CASE, format!("{format} {layout}"))
        .output()
        .expect("run the measuring child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child {format} {layout} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .find_map(|l| l.split_once("peak growth KiB: ").map(|(_, v)| v))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no measurement from child {format} {layout}:\n{stdout}"))
}

#[test]
fn one_large_file_costs_what_many_small_files_cost() {
    if let Ok(case) = std::env::var(CASE) {
        let (format, layout) = case.split_once(' ').expect("format and layout");
        let format = if format == "json" {
            Format::Json
        } else {
            Format::Yaml
        };
        println!("peak growth KiB: {}", measure(format, layout == "one"));
        return;
    }
    for format in ["yaml", "json"] {
        let one = measure_apart(format, "one");
        let many = measure_apart(format, "many");
        eprintln!(
            "{format}: {SERVICES} services, peak growth: one file {one} KiB, {} files {many} KiB",
            SERVICES / PER_FILE
        );
        // The services themselves, plus what one element and the allocator's slack cost.
        assert!(
            one <= many * 3 / 2 + 4 * MIB,
            "{format}: one file raised the peak by {one} KiB, {} files by {many} KiB",
            SERVICES / PER_FILE
        );
    }
}
