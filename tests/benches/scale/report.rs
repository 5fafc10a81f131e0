//! The report: CSV files in `target/scale/`, the targets with their verdicts and floors, and the
//! table printed on stdout (and kept as `run.txt`).

use std::fmt::Write as _;
use std::fs;
use std::io::Write as _;
use std::path::Path;

use mcp_core::testing::bench::Mem;

use crate::delta::{Change, STAGES};
use crate::phases::{Ctx, RssRow, SizeRow};
use crate::sinks::Push;
use crate::util::{fit, pcts, quantile};
use crate::{EPS, MB, MIB};

/// What the run was, besides its rows.
pub struct Run {
    pub machine: String,
    pub commit: String,
    /// The work tree had uncommitted changes.
    pub dirty: bool,
    pub wall_s: f64,
    /// Clock ticks per second (the idle CPU's resolution).
    pub ticks: f64,
    /// The adapter on an empty directory.
    pub empty_mem: Mem,
}

struct Target {
    what: String,
    endpoints: usize,
    limit: String,
    measured: f64,
    unit: &'static str,
    floor: String,
    pass: bool,
}

fn verdict(pass: bool) -> &'static str {
    if pass {
        "PASS"
    } else {
        "FAIL"
    }
}

fn write_csv(path: &Path, header: &str, rows: &[String]) {
    let mut text = format!("{header}\n");
    for r in rows {
        text.push_str(r);
        text.push('\n');
    }
    fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// `{x:.3}`, or nothing.
fn opt_ms(v: Option<f64>) -> String {
    v.map_or(String::new(), |x| format!("{x:.3}"))
}

/// The RSS sweep's least-squares fit: MiB per sink and the intercept.
fn rss_fit(rss_rows: &[RssRow]) -> (Vec<(f64, f64)>, f64, f64) {
    let points: Vec<(f64, f64)> = rss_rows
        .iter()
        .map(|r| (r.sinks as f64, r.mem.rss_mib()))
        .collect();
    let (slope, intercept) = fit(&points);
    (points, slope, intercept)
}

/// Writes the CSV files, then prints the table and keeps it as `run.txt`.
pub fn report(ctx: &Ctx, run: &Run, rows: &[SizeRow], rss_rows: &[RssRow]) {
    let root = &ctx.root;
    let n = ctx.knobs.push_sinks;
    write_csvs(root, n, rows, rss_rows);
    let targets = targets(ctx, run, rows, rss_rows);
    write_csv(
        &root.join("targets.csv"),
        "target,endpoints,limit,measured,unit,floor,verdict",
        &targets
            .iter()
            .map(|t| {
                format!(
                    "\"{}\",{},{},{:.4},{},\"{}\",{}",
                    t.what,
                    t.endpoints,
                    t.limit,
                    t.measured,
                    t.unit,
                    t.floor,
                    verdict(t.pass)
                )
            })
            .collect::<Vec<_>>(),
    );
    let out = table(ctx, run, rows, rss_rows, &targets);
    print!("{out}");
    let _ = std::io::stdout().flush();
    fs::write(root.join("run.txt"), out).expect("write run.txt");
}

fn write_csvs(root: &Path, n: usize, rows: &[SizeRow], rss_rows: &[RssRow]) {
    write_csv(
        &root.join("rss_vs_sinks.csv"),
        "endpoints,sinks,vmrss_mib,vmhwm_mib,push_s,response_bytes,connected_sinks",
        &rss_rows
            .iter()
            .map(|r| {
                format!(
                    "{},{},{:.2},{:.2},{:.4},{},{}",
                    r.endpoints,
                    r.sinks,
                    r.mem.rss_mib(),
                    r.mem.hwm_mib(),
                    r.push_s,
                    r.bytes,
                    r.connected
                )
            })
            .collect::<Vec<_>>(),
    );
    // Per size: the push to one sink, then to `n` (with the memory it left).
    let push_rows: Vec<String> = rows
        .iter()
        .flat_map(|r| {
            let pushes: [(usize, Push, Option<f64>, Option<Mem>); 2] = [
                (1, r.push_one, r.floor_one, None),
                (n, r.push_many, r.floor_many, Some(r.mem_many)),
            ];
            pushes.map(|(sinks, push, floor, mem)| {
                format!(
                    "{},{},{sinks},{:.4},{},{},{}",
                    r.endpoints,
                    r.services,
                    push.secs(),
                    floor.map_or(String::new(), |f| format!("{f:.4}")),
                    push.bytes,
                    mem.map_or(",".into(), |m| format!(
                        "{:.2},{:.2}",
                        m.rss_mib(),
                        m.hwm_mib()
                    ))
                )
            })
        })
        .collect();
    write_csv(
        &root.join("push_vs_endpoints.csv"),
        "endpoints,services,sinks,push_s,floor_push_s,response_bytes,vmrss_mib,vmhwm_mib",
        &push_rows,
    );
    write_csv(
        &root.join("sizes.csv"),
        "endpoints,services,files,inventory_mib,ready_s,startup_cpu_s,scan_s,reset_to_published_s,floor_encode_mean_ms,floor_encode_min_ms,floor_encoded_mib,vmrss0_mib,vmhwm0_mib",
        &rows
            .iter()
            .map(|r| {
                format!(
                    "{},{},{},{:.2},{:.3},{:.3},{:.3},{:.4},{:.2},{:.2},{:.2},{:.2},{:.2}",
                    r.endpoints,
                    r.services,
                    r.files,
                    r.inventory_bytes as f64 / MIB,
                    r.startup.ready_s,
                    r.startup.cpu_s,
                    r.startup.scan_s,
                    r.startup.reset_to_published_s,
                    r.floor_encode_ms.0,
                    r.floor_encode_ms.1,
                    r.floor_bytes as f64 / MIB,
                    r.mem0.rss_mib(),
                    r.mem0.hwm_mib()
                )
            })
            .collect::<Vec<_>>(),
    );
    let delta_rows: Vec<String> = rows
        .iter()
        .filter_map(|r| r.delta.as_ref().map(|d| (r.endpoints, d)))
        .flat_map(|(endpoints, d)| {
            d.iter().map(move |c| {
                let stages: Vec<String> = STAGES.iter().map(|(_, _, ms)| opt_ms(ms(c))).collect();
                format!("{endpoints},{},{},{}", c.k, c.file, stages.join(","))
            })
        })
        .collect();
    let columns: Vec<&str> = STAGES.iter().map(|(column, _, _)| *column).collect();
    write_csv(
        &root.join("delta.csv"),
        &format!("endpoints,k,file,{}", columns.join(",")),
        &delta_rows,
    );
}

fn targets(ctx: &Ctx, run: &Run, rows: &[SizeRow], rss_rows: &[RssRow]) -> Vec<Target> {
    let n = ctx.knobs.push_sinks;
    let mut targets = Vec::new();
    let rss_limit_mib = 150.0 * MB / MIB;
    let rss_at = |sinks: usize| rss_rows.iter().find(|r| r.sinks == sinks);
    let rss_floor = rss_at(0).map_or(String::new(), |r| {
        format!(
            "0 sinks {:.1} MiB; empty {:.1} MiB",
            r.mem.rss_mib(),
            run.empty_mem.rss_mib()
        )
    });
    for sinks in [21, 100] {
        if let Some(r) = rss_at(sinks) {
            targets.push(Target {
                what: format!("RSS, {sinks} SotW sinks"),
                endpoints: r.endpoints,
                limit: "150 MB".into(),
                measured: r.mem.rss_mib(),
                unit: "MiB",
                floor: rss_floor.clone(),
                pass: r.mem.rss_mib() <= rss_limit_mib,
            });
        }
    }
    let (points, slope, intercept) = rss_fit(rss_rows);
    if points.len() >= 2 {
        targets.push(Target {
            what: "extra RSS per SotW sink (slope)".into(),
            endpoints: ctx.knobs.rss_endpoints,
            limit: "1 MiB".into(),
            measured: slope,
            unit: "MiB",
            floor: format!("intercept {intercept:.1} MiB"),
            pass: slope <= 1.0,
        });
    }
    let Some(r) = rows.last() else {
        return targets;
    };
    let s = r.startup.reset_to_published_s;
    targets.push(Target {
        what: "registry Reset -> snapshot published (cold)".into(),
        endpoints: r.endpoints,
        limit: "2 s".into(),
        measured: s,
        unit: "s",
        floor: format!("prost build+encode {:.3} s", r.floor_encode_ms.0 / 1e3),
        pass: s <= 2.0,
    });
    targets.push(Target {
        what: format!("peak RSS (VmHWM), {n} SotW sinks"),
        endpoints: r.endpoints,
        limit: "1 GB".into(),
        measured: r.mem_many.hwm_mib(),
        unit: "MiB",
        floor: format!(
            "0 sinks {:.1} MiB; encoded set {:.1} MiB",
            r.mem0.rss_mib(),
            r.floor_bytes as f64 / MIB
        ),
        pass: r.mem_many.hwm_kib as f64 * 1024.0 <= 1e9,
    });
    targets.push(Target {
        what: format!("full SotW push, {n} sinks at once, until the last holds it"),
        endpoints: r.endpoints,
        limit: "3 s".into(),
        measured: r.push_many.secs(),
        unit: "s",
        floor: r
            .floor_many
            .map_or(String::new(), |f| format!("bare tonic replay {f:.3} s")),
        pass: r.push_many.secs() <= 3.0,
    });
    if let Some(d) = &r.delta {
        let open: Vec<f64> = d.iter().filter_map(Change::open_to_sink_ms).collect();
        let p99 = quantile(&open, 0.99);
        let published: Vec<f64> = d.iter().filter_map(Change::published_to_sink_ms).collect();
        targets.push(Target {
            what: "one changed service -> delta sink, p99 (file opened -> sink)".into(),
            endpoints: r.endpoints,
            limit: "10 ms".into(),
            measured: p99,
            unit: "ms",
            floor: format!(
                "published -> sink p99 {:.2} ms; default --coalesce 20ms",
                quantile(&published, 0.99)
            ),
            pass: p99 <= 10.0,
        });
    }
    if let Some(i) = &r.idle {
        targets.push(Target {
            what: format!("idle CPU, {n} sinks, nothing changing"),
            endpoints: r.endpoints,
            limit: "< 0.1 %".into(),
            measured: i.pct(),
            unit: "%",
            floor: format!("resolution {:.3} %", 100.0 / run.ticks / i.secs),
            pass: i.pct() < 0.1,
        });
    }
    targets
}

fn table(
    ctx: &Ctx,
    run: &Run,
    rows: &[SizeRow],
    rss_rows: &[RssRow],
    targets: &[Target],
) -> String {
    let n = ctx.knobs.push_sinks;
    let mut out = String::new();
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "== scale: adapter-file (release, default flags), S services x {EPS} endpoints, sinks in a separate process =="
    );
    let _ = writeln!(out, "machine: {}", run.machine);
    let _ = writeln!(
        out,
        "commit {}{}; adapter {}; {} services per file; wall time {:.0} s",
        run.commit,
        if run.dirty {
            " (+ uncommitted changes)"
        } else {
            ""
        },
        ctx.knobs.adapter.display(),
        ctx.knobs.per_file,
        run.wall_s
    );
    let _ = writeln!(out, "empty adapter (floor): {}", run.empty_mem);
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:>9} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "endpoints",
        "inv MiB",
        "ready s",
        "scan s",
        "Reset->pub",
        "floor enc",
        "wire MiB",
        "RSS0 MiB",
        format!("push {n}"),
        format!("floor {n}"),
        "push 1",
        "floor 1",
        format!("HWM{n} MiB")
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:>9} {:>8.1} {:>8.2} {:>8.2} {:>9.3}s {:>8.3}s {:>9.1} {:>9.1} {:>8.3}s {:>9} {:>8.3}s {:>9} {:>9.1}",
            r.endpoints,
            r.inventory_bytes as f64 / MIB,
            r.startup.ready_s,
            r.startup.scan_s,
            r.startup.reset_to_published_s,
            r.floor_encode_ms.0 / 1e3,
            r.push_one.bytes as f64 / MIB,
            r.mem0.rss_mib(),
            r.push_many.secs(),
            r.floor_many.map_or("-".into(), |f| format!("{f:.3}s")),
            r.push_one.secs(),
            r.floor_one.map_or("-".into(), |f| format!("{f:.3}s")),
            r.mem_many.hwm_mib()
        );
    }
    for r in rows {
        if !r.check.is_empty() {
            let _ = writeln!(out, "{} endpoints: {}", r.endpoints, r.check);
        }
    }
    if !rss_rows.is_empty() {
        rss_table(&mut out, ctx, rss_rows);
    }
    for r in rows {
        if let Some(i) = &r.idle {
            let _ = writeln!(out);
            let _ = writeln!(
                out,
                "idle at {} endpoints, {n} sinks, {:.0} s: CPU {:.2} s = {:.3} % of one core; snapshots_total {} -> {}, pushes_total {} -> {}; VmRSS after {:.1} MiB",
                r.endpoints,
                i.secs,
                i.cpu_s,
                i.pct(),
                i.snapshots.0,
                i.snapshots.1,
                i.pushes.0,
                i.pushes.1,
                i.mem_after.rss_mib()
            );
        }
        if let Some(d) = &r.delta {
            let missing = d.iter().filter(|c| c.opened.is_none()).count();
            let _ = writeln!(out);
            let _ = writeln!(
                out,
                "one changed service -> delta sink at {} endpoints ({} changes; {missing} without an observed open):",
                r.endpoints,
                d.len()
            );
            for (_, label, ms) in STAGES {
                let samples: Vec<f64> = d.iter().filter_map(ms).collect();
                let _ = writeln!(out, "{label}{}", pcts(&samples));
            }
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<62} {:>9} {:>8} {:>10} {:<5} {:>4}  floor / context",
        "target", "endpoints", "limit", "measured", "", ""
    );
    for t in targets {
        let _ = writeln!(
            out,
            "{:<62} {:>9} {:>8} {:>10.3} {:<5} {:>4}  {}",
            t.what,
            t.endpoints,
            t.limit,
            t.measured,
            t.unit,
            verdict(t.pass),
            t.floor
        );
    }
    let _ = writeln!(
        out,
        "\nCSV: {}/{{rss_vs_sinks,push_vs_endpoints,sizes,delta,targets}}.csv; adapter logs in {}",
        ctx.root.display(),
        ctx.logs.display()
    );
    out
}

/// The RSS-vs-sinks sweep.
fn rss_table(out: &mut String, ctx: &Ctx, rss_rows: &[RssRow]) {
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "RSS vs SotW sinks at {} endpoints (fresh adapter per row; read {} ms after the last sink holds the set):",
        ctx.knobs.rss_endpoints,
        ctx.knobs.settle.as_millis()
    );
    let _ = writeln!(
        out,
        "{:>6} {:>10} {:>10} {:>10} {:>9} {:>10}",
        "sinks", "VmRSS MiB", "VmHWM MiB", "push s", "MiB/sink", "connected"
    );
    let base = rss_rows
        .iter()
        .find(|r| r.sinks == 0)
        .map(|r| r.mem.rss_mib());
    for r in rss_rows {
        let per = base.filter(|_| r.sinks > 0).map_or("-".into(), |b| {
            format!("{:.2}", (r.mem.rss_mib() - b) / r.sinks as f64)
        });
        let _ = writeln!(
            out,
            "{:>6} {:>10.1} {:>10.1} {:>10.3} {:>9} {:>10}",
            r.sinks,
            r.mem.rss_mib(),
            r.mem.hwm_mib(),
            r.push_s,
            per,
            r.connected
        );
    }
    let (_, slope, intercept) = rss_fit(rss_rows);
    let _ = writeln!(
        out,
        "least-squares: {slope:.2} MiB per sink + {intercept:.1} MiB"
    );
}
