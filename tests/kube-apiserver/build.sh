#!/usr/bin/env bash
# Builds a real Kubernetes API server with an embedded etcd as a test peer:
# OUTDIR/kube-apiserver-test (see main.go for its flags).
# k8s.io/kubernetes and go.etcd.io/etcd/server/v3 are pinned in go.mod (a
# scratch module of ours: Kubernetes' own go.mod points its staging modules at
# ./staging/src, so ours replaces each with its published v0.N.P tag). The
# module is built in the workspace tests/go-peers/go.work with
# tests/istio-adsc/current, so it shares one build list (and the compiled
# Kubernetes, gRPC, OpenTelemetry, ... packages) with adsc-watch-current and
# pilot-discovery; tests/go-peers/build.sh builds all three at once, and then
# this script finds the binary up to date. Modules come through the Go module
# proxy into the default module cache and are checked against the committed
# go.sum/go.work.sum (-mod=readonly: the build never edits them; flags in
# tests/go-peers/common.sh). A rebuild with nothing changed takes seconds: go
# build leaves an up-to-date binary alone. Cold: see README.md.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../go-peers/common.sh
. "$here/../go-peers/common.sh"
out="$(peer_out_dir OUTDIR "$@")"

(cd "$here" && peer_go_build -o "$out/kube-apiserver-test" .)
peer_built "$out/kube-apiserver-test" k8s.io/kubernetes go.etcd.io/etcd/server/v3
