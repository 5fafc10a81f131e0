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

# Still in step with the go-peers build list? Only a note: a module out of step costs build time
# (its packages, and those above them, compile twice), never correctness.
"$here/sync-build-list.sh" --check "$out/helm" || true
"$out/helm" version --short
