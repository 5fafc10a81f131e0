#!/usr/bin/env bash
# Builds the Nacos test peers into OUTDIR:
#   - OUTDIR/rnacos: rnacos 0.8.8 (crates.io), a Nacos server re-implemented in Rust that speaks
#     Nacos' 1.x HTTP Open API and 2.x gRPC protocol. The real Nacos server cannot be had here:
#     Maven Central serves only its client side; the server ships only as a zip.
#   - OUTDIR/nacos-registrar.jar: the official Java client (com.alibaba.nacos:nacos-client
#     2.4.3) driven over stdin (registrar/), so tests register instances over gRPC as Spring
#     Cloud Alibaba services do.
#
# rnacos is installed as a debug build without debug info (cargo install --debug with
# CARGO_PROFILE_DEV_DEBUG=0): the same server and features (it has none to leave out), the
# cheapest build of it. Measured on 2 busy cores: a release install took 18 min 45 s; the debug
# install 5 min 23 s wall (7 min 32 s user + 1 min 24 s sys), leaving a 425 MB binary, nearly
# all debug info; without debug info 6 min 41 s user + 1 min 9 s sys (12% less CPU; 9 min wall
# beside a full test run) and a 98 MB binary. It starts in about a second. It is cached outside
# the repo's target/, in
# ${MCP_PEERS_CACHE:-${XDG_CACHE_HOME:-~/.cache}/mcp-bridge-peers}/rnacos-0.8.8-debug-nodebuginfo
# (like Go's build cache), so a fresh clone on a warm machine does not build it again;
# OUTDIR/rnacos is a symlink to it. The registrar is built by tests/maven-jar.sh (only
# when a source file of it is newer than the jar).
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
for tool in cargo mvn java; do
  command -v "$tool" >/dev/null 2>&1 || { echo "$0: '$tool' is required (Rust: rustup; Debian: apt-get install maven openjdk-17-jdk-headless)" >&2; exit 1; }
done
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$1"
out="$(cd "$1" && pwd)"

version=0.8.8
cache="${MCP_PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mcp-bridge-peers}/rnacos-$version-debug-nodebuginfo"
bin="$cache/bin/rnacos"
# `rnacos --version` is answered by its argument parser before any configuration is read or any
# port is bound, so it checks the cached binary runs without starting a server.
if [ -x "$bin" ] && [ "$("$bin" --version 2>/dev/null)" = "rnacos $version" ]; then
  echo "cached: $bin"
else
  start=$(date +%s)
  # --locked: rnacos' own Cargo.lock, the dependency versions it was released with. --force:
  # a binary that is there but does not run (an interrupted copy) is built again, not kept.
  CARGO_PROFILE_DEV_DEBUG=0 cargo install rnacos --version "$version" --locked --debug --force --root "$cache"
  echo "installed $bin in $(( $(date +%s) - start ))s"
fi
ln -sfn "$bin" "$out/rnacos"

exec "$here/../maven-jar.sh" "$here/registrar" "$out" nacos-registrar.jar registrar.build.dir
