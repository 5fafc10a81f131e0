#!/usr/bin/env bash
# The fuzz targets (fuzz/fuzz_targets, cargo-fuzz and libFuzzer with AddressSanitizer): every
# decoder fed from outside the adapters.
#
#   scripts/fuzz.sh build              install what is needed and build every target (the test
#                                      command runs this in the background, then `smoke`)
#   scripts/fuzz.sh smoke              every target: its seeds (fuzz/seeds/TARGET) and working
#                                      corpus once, then FUZZ_SMOKE_SECS (default 5) seconds of new
#                                      inputs; what the test command runs
#   scripts/fuzz.sh run TARGET SECS    one long campaign (the working corpus grows in
#                                      fuzz/corpus/TARGET, gitignored; a finding lands in
#                                      fuzz/artifacts/TARGET and stops the run)
#   scripts/fuzz.sh all SECS           a campaign of SECS for every target, one after another
#   scripts/fuzz.sh list               the targets
#
# A finding is a panic (including the invariants the targets assert: fuzz/src/lib.rs), an
# allocation over -malloc_limit_mb, a resident set over -rss_limit_mb, or one input running
# longer than -timeout seconds. libFuzzer then exits non-zero and so does this script. Fix the
# cause, add a regression test with the input where the bug lived, and add the input to
# fuzz/seeds/TARGET so that every smoke run replays it.
#
# Installs what it needs: a pinned nightly Rust from rustup (cargo-fuzz needs nightly's
# -Zsanitizer; ~10 s with the minimal profile) and cargo-fuzz, built from crates.io into
# ~/.cache/mcp-bridge-peers/cargo-fuzz (cold: ~1.5 min). Builds go to fuzz/target.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The nightly the targets were written and measured with; a newer one works as well (set
# FUZZ_TOOLCHAIN=nightly), but a pinned one makes a finding reproducible.
toolchain="${FUZZ_TOOLCHAIN:-nightly-2026-05-20}"
cargo_fuzz_version=0.13.2
tools="${XDG_CACHE_HOME:-$HOME/.cache}/mcp-bridge-peers/cargo-fuzz"

# Bounds of one input: memory (one allocation, the whole process) and time.
malloc_limit_mb="${FUZZ_MALLOC_LIMIT_MB:-512}"
rss_limit_mb="${FUZZ_RSS_LIMIT_MB:-2048}"
timeout_secs="${FUZZ_TIMEOUT_SECS:-10}"

install() {
  if ! rustup run "$toolchain" rustc --version >/dev/null 2>&1; then
    rustup toolchain install "$toolchain" --profile minimal
  fi
  if ! "$tools/bin/cargo-fuzz" --version 2>/dev/null | grep -q "$cargo_fuzz_version"; then
    cargo install --locked --quiet cargo-fuzz --version "$cargo_fuzz_version" --root "$tools"
  fi
  export PATH="$tools/bin:$PATH"
}

targets() {
  cargo "+$toolchain" fuzz list
}

# final_stat UNIT NAME: libFuzzer's final `stat::NAME:` value in $log, with UNIT after it.
final_stat() {
  awk -v name="stat::$2:" -v unit="$1" '$1 == name {v = $2} END {print (v == "" ? "?" : v) " " unit}' "$log"
}

# campaign TARGET SECS: the seeds and the working corpus, then new inputs for SECS seconds. The
# whole libFuzzer output goes to fuzz/target/logs/TARGET.log; a finding prints its tail.
campaign() {
  local target="$1" secs="$2" started rc log="fuzz/target/logs/$1.log"
  mkdir -p "fuzz/corpus/$target" "fuzz/seeds/$target" fuzz/target/logs
  started=$SECONDS
  # -print_final_stats: the exec count and peak RSS (what a target got, in the summary line).
  set +e
  # bash's `time`: the CPU the fuzzer got (user + system), which on a busy machine is less than
  # the wall time.
  local TIMEFORMAT='%U %S'
  { time cargo "+$toolchain" fuzz run "$target" "fuzz/corpus/$target" "fuzz/seeds/$target" -- \
    -max_total_time="$secs" -malloc_limit_mb="$malloc_limit_mb" -rss_limit_mb="$rss_limit_mb" \
    -timeout="$timeout_secs" -print_final_stats=1 >"$log" 2>&1; } 2>"$log.cpu"
  rc=$?
  set -e
  echo "fuzz $target: exit $rc after $((SECONDS - started)) s" \
    "(CPU $(awk '{printf "%.0f s", $1 + $2}' "$log.cpu")), $(final_stat runs number_of_executed_units)," \
    "peak RSS $(final_stat MB peak_rss_mb)," \
    "corpus $(find "fuzz/corpus/$target" -type f | wc -l) + $(find "fuzz/seeds/$target" -type f | wc -l) seeds"
  if [ "$rc" -ne 0 ]; then
    tail -n 60 "$log" >&2
  fi
  return "$rc"
}

# every SECS: a campaign for every target; the ones with findings are named at the end.
every() {
  local failed=()
  cargo "+$toolchain" fuzz build
  for t in $(targets); do
    campaign "$t" "$1" || failed+=("$t")
  done
  if [ "${#failed[@]}" -gt 0 ]; then
    echo "scripts/fuzz.sh: findings in ${failed[*]} (inputs in fuzz/artifacts/, logs in fuzz/target/logs/)" >&2
    exit 1
  fi
}

install
case "${1:-smoke}" in
  list)
    targets
    ;;
  build)
    cargo "+$toolchain" fuzz build
    ;;
  smoke)
    # Stable rustfmt (the pinned nightly is installed without it): the crate needs no nightly syntax.
    (cd fuzz && cargo fmt -- --check)
    every "${FUZZ_SMOKE_SECS:-5}"
    ;;
  run)
    [ $# -eq 3 ] || { echo "usage: scripts/fuzz.sh run TARGET SECS" >&2; exit 2; }
    campaign "$2" "$3"
    ;;
  all)
    [ $# -eq 2 ] || { echo "usage: scripts/fuzz.sh all SECS" >&2; exit 2; }
    every "$2"
    ;;
  *)
    echo "usage: scripts/fuzz.sh [smoke | run TARGET SECS | all SECS | list]" >&2
    exit 2
    ;;
esac
