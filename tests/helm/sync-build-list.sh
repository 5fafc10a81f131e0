#!/usr/bin/env bash
# Keeps tests/helm/go.mod at the versions of tests/go-peers' build list (go.work: Istio's adsc and
# istiod, kube-apiserver-test) for every module the two share, so that helm's packages in common
# with them are one compile in the shared Go build cache (README.md).
#   tests/helm/sync-build-list.sh                  rewrite go.mod/go.sum (go mod edit + tidy;
#                                                  needs the Go module proxy)
#   tests/helm/sync-build-list.sh --check BINARY   list the modules linked into BINARY (the built
#                                                  helm) and into the go-peers binaries, at
#                                                  different versions; exit 1 if any
# Where helm itself needs a newer version than go-peers selects, helm's wins (MVS) and --check
# lists it: today github.com/cyphar/filepath-securejoin v0.6.1 (kube-apiserver-test: v0.6.0).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
peers="$here/../go-peers"

# "module version" of the go-peers build list: every module in it (`all`), or only the modules
# whose packages the go-peers binaries link (`linked`: what their build cache holds). In workspace
# mode `go list` adds the go.mod checksums of the module graph to go.work.sum
# (golang/go#70272, as common.sh says), so it runs on a copy of go.work and go.work.sum, and the
# committed ones stay as they are.
peer_versions() {
  local tmp
  tmp="$(mktemp -d)"
  sed "s#^\(\s*\)\.\./#\1$peers/../#" "$peers/go.work" >"$tmp/go.work"
  cp "$peers/go.work.sum" "$tmp/go.work.sum"
  if [ "$1" = all ]; then
    (cd "$peers" && GOWORK="$tmp/go.work" GOFLAGS=-mod=readonly go list -m all)
  else
    (cd "$peers" && GOWORK="$tmp/go.work" GOFLAGS=-mod=readonly go list -deps \
      -f '{{with .Module}}{{.Path}} {{.Version}}{{end}}' \
      adscwatch bridge.test/kube-apiserver istio.io/istio/pilot/cmd/pilot-discovery)
  fi | awk 'NF >= 2 { print $1, $2 }' | sort -u
  rm -rf "$tmp"
}

if [ "${1:-}" = "--check" ]; then
  binary="${2:?usage: $0 --check BINARY}"
  out_of_step="$(go version -m "$binary" |
    awk 'NR == FNR { want[$1] = $2; next }
         $1 == "dep" && ($2 in want) && want[$2] != $3 { printf "  %s %s (go-peers: %s)\n", $2, $3, want[$2] }' \
      <(peer_versions linked) -)"
  shared="$(go version -m "$binary" |
    awk 'NR == FNR { want[$1] = 1; next } $1 == "dep" && ($2 in want) { n++ } END { print n + 0 }' \
      <(peer_versions linked) -)"
  if [ -z "$out_of_step" ]; then
    echo "helm links $shared modules that the go-peers binaries link too, all at their versions"
    exit 0
  fi
  echo "helm links $shared modules that the go-peers binaries link too; at another version than theirs:"
  echo "$out_of_step"
  exit 1
fi

cd "$here"
mine="$(GOWORK=off go list -m all | awk 'NF >= 2 { print $1, $2 }')"
args="$(awk 'NR == FNR { want[$1] = $2; next }
             ($1 in want) && want[$1] != $2 { printf " -require=%s@%s", $1, want[$1] }' \
  <(peer_versions all) <(echo "$mine"))"
if [ -n "$args" ]; then
  # shellcheck disable=SC2086
  GOWORK=off go mod edit $args
fi
GOWORK=off go mod tidy
echo "tests/helm/go.mod now requires go-peers' versions of the modules it shares with them"
