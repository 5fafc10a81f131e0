#!/usr/bin/env python3
"""Plots the scale bench's CSVs (tests/benches/scale.rs) into benchmarks/scale.png.

Two panels: adapter RSS against the number of connected SotW sinks (with the 150 MB target and
the least-squares slope), and full SotW push time against inventory size (1 and 10 sinks, with
the bare-tonic floor measured in the same run and the 3 s target at 1M endpoints).

Usage: scripts/plot-scale.sh [CSV_DIR] [OUTPUT]   (defaults: target/scale, benchmarks/scale.png)
"""

import csv
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1048576.0


def num(value):
    try:
        v = float(value)
    except (TypeError, ValueError):
        return math.nan
    return v


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def fit(xs, ys):
    n = len(xs)
    if n < 2:
        return math.nan, math.nan
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    slope = sxy / sxx if sxx else math.nan
    return slope, my - slope * mx


def read_run_header(csv_dir):
    try:
        with open(os.path.join(csv_dir, "run.txt")) as f:
            lines = [l.strip() for l in f if l.strip()]
    except OSError:
        return ""
    keep = [l for l in lines if l.startswith("machine:") or l.startswith("commit")]
    return "\n".join(keep)


def rss_panel(ax, csv_dir):
    data = rows(os.path.join(csv_dir, "rss_vs_sinks.csv"))
    if not data:
        ax.text(0.5, 0.5, "no rss_vs_sinks.csv rows", ha="center", transform=ax.transAxes)
        return
    endpoints = int(num(data[0]["endpoints"]))
    sinks = [num(r["sinks"]) for r in data]
    rss = [num(r["vmrss_mib"]) for r in data]
    hwm = [num(r["vmhwm_mib"]) for r in data]
    ax.plot(sinks, rss, "o-", label="VmRSS (sinks hold the set, settled)")
    ax.plot(sinks, hwm, "s--", alpha=0.7, label="VmHWM (peak)")
    slope, intercept = fit(sinks, rss)
    if not math.isnan(slope):
        xs = [min(sinks), max(sinks)]
        ax.plot(
            xs,
            [intercept + slope * x for x in xs],
            ":",
            color="gray",
            label=f"fit: {slope:.2f} MiB/sink + {intercept:.0f} MiB",
        )
    target = 150e6 / MIB
    ax.axhline(target, color="red", linewidth=1, label="target 150 MB")
    if 0 in sinks:
        base = rss[sinks.index(0)]
        ax.plot(
            [0, max(sinks)],
            [base, base + max(sinks) * 1.0],
            color="red",
            linestyle="--",
            linewidth=0.8,
            label="target: +1 MiB per sink",
        )
    ax.set_xlabel("connected SotW sinks holding the full set")
    ax.set_ylabel("adapter-file RSS (MiB)")
    ax.set_title(f"RSS vs sinks, {endpoints:,} endpoints")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def push_panel(ax, csv_dir):
    data = rows(os.path.join(csv_dir, "push_vs_endpoints.csv"))
    if not data:
        ax.text(0.5, 0.5, "no push_vs_endpoints.csv rows", ha="center", transform=ax.transAxes)
        return
    by_sinks = {}
    for r in data:
        by_sinks.setdefault(int(num(r["sinks"])), []).append(r)
    for n, rs in sorted(by_sinks.items()):
        rs.sort(key=lambda r: num(r["endpoints"]))
        xs = [num(r["endpoints"]) for r in rs]
        line = ax.plot(xs, [num(r["push_s"]) for r in rs], "o-", label=f"adapter-file, {n} sink(s)")
        floor = [num(r["floor_push_s"]) for r in rs]
        if any(not math.isnan(f) for f in floor):
            ax.plot(
                xs,
                floor,
                "x--",
                color=line[0].get_color(),
                alpha=0.6,
                label=f"floor: bare tonic replay, {n} sink(s)",
            )
    ax.plot([1e6], [3.0], "r*", markersize=12, label="target: 10 sinks, 1M endpoints, 3 s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("endpoints (services x 10)")
    ax.set_ylabel("connect -> last sink holds the full set (s)")
    ax.set_title("Full SotW push time vs inventory size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


def main():
    csv_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target", "scale")
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "benchmarks", "scale.png")
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.2))
    rss_panel(left, csv_dir)
    push_panel(right, csv_dir)
    header = read_run_header(csv_dir)
    if header:
        fig.text(0.01, 0.005, header, fontsize=7, color="dimgray", va="bottom")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=120)
    print(out)


if __name__ == "__main__":
    main()
