#!/usr/bin/env bash
# Builds the adsc-watch test peer twice, once per pinned Istio version:
#   OUTDIR/adsc-watch-current  (istio.io/istio pinned in current/go.mod)
#   OUTDIR/adsc-watch-1.22     (istio.io/istio pinned in v1_22/go.mod)
# Modules come through the Go module proxy into the default module cache and
# are checked against the committed go.sum files (-mod=readonly: the build
# never edits go.mod/go.sum). A rebuild with nothing changed takes seconds:
# go build leaves an up-to-date binary alone.
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$1"
out="$(cd "$1" && pwd)"

build() {
  local module="$1" binary="$2"
  # -buildvcs=false: the sources sit in the project's git checkout; stamping
  # its state would relink the binary whenever any file of the project changes.
  (cd "$here/$module" && go build -mod=readonly -buildvcs=false -o "$out/$binary" .)
  local istio
  istio="$(go version -m "$out/$binary" | awk '$1 == "dep" && $2 == "istio.io/istio" { print $3 }')"
  echo "built $out/$binary (istio.io/istio $istio, $(go env GOVERSION))"
}

build current adsc-watch-current
build v1_22 adsc-watch-1.22
