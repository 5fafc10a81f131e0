#!/usr/bin/env bash
# Builds the Nacos test peers into OUTDIR:
#   - OUTDIR/nacos-2.4.3 and OUTDIR/nacos-3.0.3: the real Nacos servers, built from upstream's
#     source tarballs and cached outside the clone (build-server.sh; cold about 2 min each);
#   - OUTDIR/nacos-registrar.jar: the official Java client (com.alibaba.nacos:nacos-client
#     2.4.3) driven over stdin (registrar/), so tests register instances over gRPC as Spring
#     Cloud Alibaba services do;
#   - OUTDIR/dubbo-provider.jar: a Dubbo 3 provider (dubbo-provider/) that registers itself
#     through Dubbo's own Nacos registry, at interface and at application level.
# The jars are built by tests/maven-jar.sh (only when a source file of theirs is newer).
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

"$here/build-server.sh" "$out" 2.4.3 3.0.3
"$here/../maven-jar.sh" "$here/registrar" "$out" nacos-registrar.jar registrar.build.dir
"$here/../maven-jar.sh" "$here/dubbo-provider" "$out" dubbo-provider.jar dubboprovider.build.dir
