#!/usr/bin/env bash
# Builds a real Consul agent as a test peer: OUTDIR/consul.
# github.com/hashicorp/consul is pinned in go.mod (a scratch module of ours,
# since `go install github.com/hashicorp/consul@vX` refuses Consul's own go.mod
# for its replace directives). Modules come through the Go module proxy into
# the default module cache and are checked against the committed go.sum
# (-mod=readonly: the build never edits go.mod/go.sum). A rebuild with nothing
# changed takes seconds: go build leaves an up-to-date binary alone.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../go-peers/common.sh
. "$here/../go-peers/common.sh"
out="$(peer_out_dir OUTDIR "$@")"

# -buildvcs=false: the sources sit in the project's git checkout; stamping
# its state would relink the binary whenever any file of the project changes.
# CGO_ENABLED=0: a static binary, as HashiCorp ships it; no C toolchain needed.
# -s -w: no symbol table or DWARF (about a third smaller; a peer, not debugged).
(cd "$here" && CGO_ENABLED=0 go build -mod=readonly -buildvcs=false -trimpath \
  -ldflags='-s -w' -o "$out/consul" github.com/hashicorp/consul)

peer_built "$out/consul" github.com/hashicorp/consul
"$out/consul" version
