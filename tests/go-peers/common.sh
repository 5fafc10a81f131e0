# Sourced by the build scripts of the Go test peers (tests/go-peers/build.sh,
# tests/istio-adsc/build.sh, tests/kube-apiserver/build.sh, tests/consul/build.sh).
#
# peer_out_dir NAME ARGS...  the script's one argument ARGS (else: "usage: $0 NAME"
#                            and exit 2), created, printed as an absolute path:
#                            out="$(peer_out_dir OUTDIR "$@")"
# peer_go_build ARGS...   go build with the flags every Go peer uses, in the
#                         workspace tests/go-peers/go.work; for a module
#                         outside it: PEER_GOWORK=off peer_go_build ARGS...
# peer_built BINARY MODULE...
#                         "built BINARY (MODULE version, ..., Go version)": the
#                         versions of MODULE... (dependencies or the main
#                         module) linked into BINARY.
#
# One flag set for every Go peer (tests/consul/build.sh passes the same): the Go build cache keys a
# compiled package by its flags too, so a package that two peers use at the
# same version is compiled once only if both builds pass the same ones.
#   CGO_ENABLED=0   static binaries, no C toolchain; the pure-Go net resolver.
#   -trimpath       no local paths in the binaries (reproducible builds).
#   -buildvcs=false the sources sit in the project's git checkout; stamping its
#                   state would relink every binary whenever any file changes.
#   -ldflags=-s -w  no symbol table or DWARF (a third smaller; link-only, so
#                   it does not change how packages are compiled).
#   -mod=readonly   the build never edits go.mod/go.sum. In workspace mode Go
#                   still adds missing checksums to go.work.sum (intentional,
#                   golang/go#70272), so peer_go_build puts go.work.sum back and
#                   fails if the build changed it: the committed files must
#                   already hold every checksum, as a go.sum must.

go_peers_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

peer_out_dir() {
  local name="$1"
  shift
  if [ $# -ne 1 ]; then
    echo "usage: $0 $name" >&2
    exit 2
  fi
  mkdir -p "$1"
  (cd "$1" && pwd)
}

peer_built() {
  local binary="$1" mods
  shift
  mods="$(go version -m "$binary" | awk -v wanted="$*" '
    BEGIN { n = split(wanted, w, " "); for (i = 1; i <= n; i++) want[w[i]] = 1 }
    ($1 == "dep" || $1 == "mod") && ($2 in want) { printf "%s%s %s", sep, $2, $3; sep = ", " }')"
  echo "built $binary ($mods, $(go env GOVERSION))"
}

peer_go_build() {
  local sum="$go_peers_dir/go.work.sum" saved rc=0
  saved="$(mktemp)"
  cp "$sum" "$saved"
  CGO_ENABLED=0 GOWORK="${PEER_GOWORK:-$go_peers_dir/go.work}" \
    go build -mod=readonly -buildvcs=false -trimpath -ldflags='-s -w' "$@" || rc=$?
  if ! cmp -s "$saved" "$sum"; then
    echo "error: this build added checksums to tests/go-peers/go.work.sum:" >&2
    diff "$saved" "$sum" >&2 || true
    echo "(put back; if the new modules are intended, add those lines and commit them)" >&2
    cp "$saved" "$sum"
    rc=1
  fi
  rm -f "$saved"
  return "$rc"
}
