#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs/builds the real peers it needs, then runs every
# test including the #[ignore]d ones that need those peers.
#   - Istio's own MCP client (istio.io/istio/pkg/adsc), built from the Go module proxy into
#     target/adsc (cold: ~8 min and ~1.5 GB of Go caches; warm: seconds);
#   - Consul, built from the Go module proxy into target/consul (cold: ~11 min; warm: seconds);
#   - a Spring Cloud Eureka server, built with Maven into target/eureka (cold: ~1.5 min);
#   - ZooKeeper, Debian's package (apt-get; needs root, as on CI machines).
# Usage: scripts/test.sh            (from anywhere inside the repo)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

need() {
  command -v "$1" >/dev/null 2>&1 || { echo "scripts/test.sh: '$1' is required but not installed ($2)" >&2; exit 1; }
}
need cargo "install Rust with rustup"
need go "install Go >= 1.25 (the Istio client needs it)"
need java "install a JDK >= 17 (the Eureka test server needs it)"
need mvn "install Maven (it builds the Eureka test server)"

echo "==> building Istio's MCP client (tests/istio-adsc)"
tests/istio-adsc/build.sh target/adsc

echo "==> building Consul (tests/consul)"
tests/consul/build.sh target/consul

echo "==> building the Eureka test server (tests/eureka, Maven Central)"
tests/eureka/build.sh target/eureka

echo "==> installing ZooKeeper (Debian package)"
scripts/install-zookeeper.sh

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

echo "==> cargo build --workspace --bins --examples (the end-to-end tests run the real binaries and zk-writer)"
cargo build --workspace --bins --examples

echo "==> cargo test (including tests that need real peers)"
ADSC_WATCH_DIR="$PWD/target/adsc" CONSUL_BIN_DIR="$PWD/target/consul" \
  EUREKA_JAR="$PWD/target/eureka/eureka-test.jar" cargo test --workspace -- --include-ignored
