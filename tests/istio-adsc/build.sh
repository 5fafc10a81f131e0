#!/usr/bin/env bash
# Builds the adsc-watch test peer twice, once per pinned Istio version:
#   OUTDIR/adsc-watch-current  (istio.io/istio pinned in current/go.mod)
#   OUTDIR/adsc-watch-1.22     (istio.io/istio pinned in v1_22/go.mod)
# Modules come through the Go module proxy into the default module cache and
# are checked against the committed go.sum files (-mod=readonly: the build
# never edits go.mod/go.sum). current/ is built in the workspace
# tests/go-peers/go.work, which it shares with tests/kube-apiserver and
# istiod (pilot-discovery), so that the packages they have in common are
# compiled once; tests/go-peers/build.sh builds all three at once (and then
# this script finds adsc-watch-current up to date). v1_22/ is a module of its
# own. Both with the flags every Go peer uses (tests/go-peers/common.sh). A
# rebuild with nothing changed takes seconds: go build leaves an up-to-date
# binary alone.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../go-peers/common.sh
. "$here/../go-peers/common.sh"
out="$(peer_out_dir OUTDIR "$@")"

(cd "$here/current" && peer_go_build -o "$out/adsc-watch-current" .)
peer_built "$out/adsc-watch-current" istio.io/istio
(cd "$here/v1_22" && PEER_GOWORK=off peer_go_build -o "$out/adsc-watch-1.22" .)
peer_built "$out/adsc-watch-1.22" istio.io/istio
