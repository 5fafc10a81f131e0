#!/usr/bin/env bash
# Builds the four Go test peers that share one build list, in one go build:
#   TARGETDIR/adsc/adsc-watch-current   tests/istio-adsc/current (Istio's adsc)
#   TARGETDIR/istio/pilot-discovery     istiod, unmodified: istio.io/istio/pilot/cmd/pilot-discovery
#                                       at the istio.io/istio that current/go.mod pins
#   TARGETDIR/istio/istio-validate      tests/istio-validate (Istio's ValidateServiceEntry over
#                                       JSON lines: the tests' validity oracle)
#   TARGETDIR/kube/kube-apiserver-test  tests/kube-apiserver (kube-apiserver + embedded etcd)
# The workspace go.work here joins the three modules into one build list, so the
# Kubernetes, gRPC, OpenTelemetry, ... packages they share are compiled once
# (see README.md). One go build for all three lets the links and the last
# compiles of one binary overlap with the others' on a 2-core machine; go build
# writes into TARGETDIR/go-peers and the binaries are hard-linked into place.
# A rebuild with nothing changed takes seconds: go build leaves an up-to-date
# binary alone. Cold: about 13 min on 2 busy cores (README.md).
# Then, in a second go build, Istio 1.7.8's legacy MCP sink, a module of its own outside the
# workspace (Istio 1.7's Kubernetes 1.18, gRPC 1.29, ... cannot share a build list with today's):
#   TARGETDIR/adsc/mcp-sink-1.7         istio17-sink (istio.io/istio/pkg/mcp/sink, as Pilot 1.7)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
. "$here/common.sh"
target="$(peer_out_dir TARGETDIR "$@")"
stage="$target/go-peers"
mkdir -p "$stage" "$target/adsc" "$target/istio" "$target/kube"

# Binary names from the packages: adscwatch (module adscwatch),
# kube-apiserver (module bridge.test/kube-apiserver), istio-validate (module
# bridge.test/istio-validate), pilot-discovery.
peer_go_build -o "$stage/" adscwatch bridge.test/kube-apiserver bridge.test/istio-validate \
  istio.io/istio/pilot/cmd/pilot-discovery

place() {
  ln -f "$stage/$1" "$2" 2>/dev/null || cp -f "$stage/$1" "$2"
  peer_built "$2" istio.io/istio k8s.io/kubernetes go.etcd.io/etcd/server/v3
}
place adscwatch "$target/adsc/adsc-watch-current"
place pilot-discovery "$target/istio/pilot-discovery"
place istio-validate "$target/istio/istio-validate"
place kube-apiserver "$target/kube/kube-apiserver-test"

# Cold: ~2.5 min on 2 busy cores (516 packages, ~0.4 GB of build cache); warm: ~4 s (README.md).
(cd "$here/istio17-sink" && PEER_GOWORK=off peer_go_build -o "$target/adsc/mcp-sink-1.7" .)
peer_built "$target/adsc/mcp-sink-1.7" istio.io/istio

# Istio's CRDs from the same Istio module, beside istiod: the traffic tests apply them to the test
# API server so that istiod reads DestinationRules, VirtualServices, ... through `k8s://`.
istio_dir="$(cd "$here" && GOWORK="$here/go.work" GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' istio.io/istio)"
install -m 0644 "$istio_dir/manifests/charts/base/files/crd-all.gen.yaml" "$target/istio/crd-all.gen.yaml"
echo "copied Istio's CRDs to $target/istio/crd-all.gen.yaml"
