#!/usr/bin/env bash
# Builds the real helm as a test peer: OUTDIR/helm (tests/tests/helm_chart.rs finds it through
# HELM_BIN, which scripts/test.sh sets; default target/helm/helm).
# helm.sh/helm/v3 is pinned in go.mod here (a scratch module of ours, `tool` directive). Modules
# come through the Go module proxy into the default module cache and are checked against the
# committed go.sum (-mod=readonly: the build never edits go.mod/go.sum). Built with the flags
# every Go peer uses (tests/go-peers/common.sh) into the same Go build cache, and go.mod requires
# the versions of tests/go-peers' build list wherever the two share a module, so the Kubernetes
# client, API machinery, gRPC, protobuf, ... packages istiod and kube-apiserver-test already
# compiled are not compiled again (README.md). A rebuild with nothing changed takes seconds.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../go-peers/common.sh
. "$here/../go-peers/common.sh"
out="$(peer_out_dir OUTDIR "$@")"

# A module of its own, not in the go-peers workspace (README.md: helm would raise two modules of
# kube-apiserver-test there).
(cd "$here" && PEER_GOWORK=off peer_go_build -o "$out/helm" helm.sh/helm/v3/cmd/helm)
peer_built "$out/helm" helm.sh/helm/v3 k8s.io/client-go

# The Prometheus Operator's CRDs for PodMonitor, ServiceMonitor and PrometheusRule, which
# tests/tests/helm_monitoring.rs applies to the test kube-apiserver (PROMETHEUS_OPERATOR_CRDS,
# default target/helm/prometheus-operator-crds): the operator's root module holds them as
# generated YAML (example/prometheus-operator-crd/). Its zip is checked against the checksum
# database like any module; nothing of it is built. Downloaded from outside any module (no go.mod
# or go.sum of ours changes); warm, this is the module cache and three compares.
# v0.85.0: the one version of the root module the module proxy serves here (v0.95.2 is refused).
prom_op="github.com/prometheus-operator/prometheus-operator@v0.85.0"
crds_out="$out/prometheus-operator-crds"
prom_op_json="$(cd / && GOWORK=off go mod download -json "$prom_op")" || {
  echo "$prom_op_json" >&2
  exit 1
}
prom_op_dir="$(printf '%s\n' "$prom_op_json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
if [ -z "$prom_op_dir" ] || [ ! -d "$prom_op_dir/example/prometheus-operator-crd" ]; then
  echo "error: go mod download $prom_op gave no module directory with example/prometheus-operator-crd:" >&2
  echo "$prom_op_json" >&2
  exit 1
fi
mkdir -p "$crds_out"
for crd in podmonitors servicemonitors prometheusrules; do
  src="$prom_op_dir/example/prometheus-operator-crd/monitoring.coreos.com_$crd.yaml"
  dst="$crds_out/monitoring.coreos.com_$crd.yaml"
  # The module cache's files are read-only; the copies are ordinary files.
  cmp -s "$src" "$dst" || install -m 0644 "$src" "$dst"
done
echo "prometheus-operator CRDs ($prom_op): $crds_out"

# Still in step with the go-peers build list? Only a note: a module out of step costs build time
# (its packages, and those above them, compile twice), never correctness.
"$here/sync-build-list.sh" --check "$out/helm" || true
"$out/helm" version --short
