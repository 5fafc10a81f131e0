#!/usr/bin/env bash
# Builds a real Spring Cloud Netflix Eureka server as a test peer: OUTDIR/eureka-test.jar.
# Versions are pinned in pom.xml; tests/maven-jar.sh builds it (skipped when the jar is newer
# than every source file here, so calling it before each test run costs nothing).
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
for tool in mvn java; do
  command -v "$tool" >/dev/null 2>&1 || { echo "$0: '$tool' is required (Debian: apt-get install maven openjdk-17-jdk-headless)" >&2; exit 1; }
done
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec "$here/../maven-jar.sh" "$here" "$1" eureka-test.jar eureka.build.dir
