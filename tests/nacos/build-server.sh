#!/usr/bin/env bash
# Builds the real Nacos server of each VERSION from its upstream source tarball and links it into
# OUTDIR/nacos-VERSION, laid out as an unpacked official release (NACOS_HOME): the runnable jar
# in target/nacos-server.jar, the release's conf/application.properties beside it.
#
# Usage: tests/nacos/build-server.sh OUTDIR VERSION...   (VERSION: 2.4.3, 3.0.3)
#
# The sources are `git archive`s of the upstream tags, unchanged, in nacos-VERSION-src.tar.gz
# of $NACOS_PEERS_DIR, else <repo>/../shared/peers, else /work/shared/peers (Maven Central
# serves only Nacos' client side, not its server modules). Without a tarball, a build of that
# version already in the cache is used. Every dependency comes from Maven Central into the
# local Maven repository (~400 MB, cold). Measured on 2 cores: 2.4.3 about 2 min 10 s, 3.0.3
# about 2 min 20 s with a warm repository for the first, each leaving a 160-210 MB jar.
#
# The result is cached outside the clone, in
# ${MCP_PEERS_CACHE:-${XDG_CACHE_HOME:-~/.cache}/mcp-bridge-peers}/nacos-server-VERSION-SHA
# (SHA: the tarball's first 12 hex digits of SHA-256), so a fresh clone on a warm machine builds
# nothing; a changed tarball is built again. A user with an official release unpacked instead
# points the tests at it with NACOS2_HOME / NACOS3_HOME and needs none of this.
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 OUTDIR VERSION..." >&2
  exit 2
fi
for tool in mvn java tar sha256sum; do
  command -v "$tool" >/dev/null 2>&1 || { echo "$0: '$tool' is required (Debian: apt-get install maven openjdk-17-jdk-headless)" >&2; exit 1; }
done
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
mkdir -p "$1"
out="$(cd "$1" && pwd)"
shift
cache_root="${MCP_PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mcp-bridge-peers}"

for version in "$@"; do
  case "$version" in
    2.*) module=console ;;
    3.*) module=bootstrap ;;
    *) echo "$0: no build recipe for Nacos $version" >&2; exit 2 ;;
  esac
  tarball=""
  for dir in ${NACOS_PEERS_DIR:+"$NACOS_PEERS_DIR"} "$repo/../shared/peers" /work/shared/peers; do
    if [ -f "$dir/nacos-$version-src.tar.gz" ]; then
      tarball="$dir/nacos-$version-src.tar.gz"
      break
    fi
  done
  if [ -n "$tarball" ]; then
    sha="$(sha256sum "$tarball" | cut -c1-12)"
    home="$cache_root/nacos-server-$version-$sha"
  else
    home="$(ls -d "$cache_root/nacos-server-$version-"* 2>/dev/null | grep -v '\.tmp$' | tail -n 1 || true)"
    if [ -z "$home" ] || [ ! -f "$home/target/nacos-server.jar" ]; then
      echo "$0: no nacos-$version-src.tar.gz (looked in \$NACOS_PEERS_DIR, $repo/../shared/peers, /work/shared/peers) and no cached build; set NACOS_PEERS_DIR, or NACOS2_HOME/NACOS3_HOME to an unpacked release" >&2
      exit 1
    fi
    echo "no source tarball found; using the cached build $home"
  fi
  if [ -f "$home/target/nacos-server.jar" ] && [ -f "$home/conf/application.properties" ]; then
    echo "cached: $home"
  else
    start=$(date +%s)
    work="$(mktemp -d "${TMPDIR:-/tmp}/nacos-src.XXXXXX")"
    tar -xzf "$tarball" -C "$work"
    src="$(find "$work" -mindepth 1 -maxdepth 1 -type d | head -n 1)"
    # Tests, license and style checks skipped: the sources are upstream's, unchanged, and only
    # the server's runnable jar is wanted. `package`, not `install`: nothing of Nacos goes into
    # the local repository.
    mvn -B -q -Dstyle.color=never -f "$src/pom.xml" -Prelease-nacos \
      -Dmaven.test.skip=true -Drat.skip=true -Dcheckstyle.skip=true -Dpmd.skip=true \
      -Djacoco.skip=true -Dmaven.javadoc.skip=true -Dmaven.source.skip=true \
      package -pl "$module" -am
    rm -rf "$home.tmp"
    mkdir -p "$home.tmp/target" "$home.tmp/conf"
    cp "$src/$module/target/nacos-server.jar" "$home.tmp/target/"
    cp "$src/distribution/conf/application.properties" "$home.tmp/conf/"
    cp "$src/LICENSE" "$src/NOTICE" "$home.tmp/"
    rm -rf "$work" "$home"
    # Renamed once complete: an interrupted build never looks cached.
    mv "$home.tmp" "$home"
    echo "built Nacos $version in $(( $(date +%s) - start ))s: $home"
  fi
  ln -sfn "$home" "$out/nacos-$version"
done
