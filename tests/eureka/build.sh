#!/usr/bin/env bash
# Builds a real Spring Cloud Netflix Eureka server as a test peer: OUTDIR/eureka-test.jar.
# Versions are pinned in pom.xml; artifacts come from Maven Central into ~/.m2 (later
# builds need no network). Skips the build when the jar is newer than every
# source file here, so calling it before each test run costs nothing.
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
for tool in mvn java; do
  command -v "$tool" >/dev/null 2>&1 || { echo "$0: '$tool' is required (Debian: apt-get install maven openjdk-17-jdk-headless)" >&2; exit 1; }
done
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$1"
out="$(cd "$1" && pwd)"
jar="$out/eureka-test.jar"

if [ -f "$jar" ] && [ -z "$(find "$here/pom.xml" "$here/src" -newer "$jar" -print -quit)" ]; then
  echo "up to date: $jar"
  exit 0
fi

# The Maven build directory lives under OUTDIR, never in the source tree.
start=$(date +%s)
mvn -q -B -Dstyle.color=never -f "$here/pom.xml" -DskipTests \
  -Deureka.build.dir="$out/maven" \
  package
built="$(ls "$out"/maven/eureka-test.jar 2>/dev/null || true)"
if [ -z "$built" ]; then
  echo "maven produced no eureka-test.jar under $out/maven" >&2
  exit 1
fi
cp "$built" "$jar.tmp"
mv "$jar.tmp" "$jar"
echo "built $jar in $(( $(date +%s) - start ))s"
