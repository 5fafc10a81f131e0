#!/usr/bin/env bash
# Builds the project's images with podman from the files as users get them, on the stand-ins of
# tests/containers/build.sh (run that first):
#   docker/Dockerfile, every adapter target   ghcr.io/example/mcp-adapter-<name>:0.1.0
#   docker/Dockerfile.eureka                  ghcr.io/example/mcp-demo-eureka-server:0.1.0
# (the names docker/compose.yaml and deploy/ use). The builder stage compiles the workspace with
# `cargo build --release --locked` on the Rust the Dockerfile names (cold: ~20 min on 2 cores);
# its cache mounts (cargo's registry, target/) live in buildah's cache ($TMPDIR/buildah-cache,
# /var/tmp by default), outside the clone, so a
# later run on the same machine compiles only what changed.
# Differences from `docker build` (BuildKit), each needed by podman 4.3 / buildah 1.28:
#   --format docker    OCI images have no HEALTHCHECK; Docker's own format has it
#   --ignorefile F     BuildKit reads docker/Dockerfile.dockerignore beside the Dockerfile by
#                      itself; buildah 1.28 reads only the context's .dockerignore
#   --pull=never       the stand-ins are local; nothing can be pulled here
# Usage: tests/containers/build-images.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
. "$here/common.sh"
cd "$repo_dir"

build() {
  local file="$1" tag="$2" log
  shift 2
  log="$(mktemp)"
  echo "image $tag ($file $*)"
  if ! standin_podman build --format docker --pull=never --ignorefile "$file.dockerignore" \
      -f "$file" -t "$tag" "$@" . >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    echo "build-images.sh: building $tag failed" >&2
    exit 1
  fi
  grep -E 'Finished|^Error|^error' "$log" | sed 's/^ */    /' || true
  rm -f "$log"
}

# Not pruned afterwards: the build cache (the builder stage's layers) is what makes a rebuild on
# the same machine take seconds.
for adapter in file consul zookeeper eureka kube nacos; do
  build docker/Dockerfile "ghcr.io/example/mcp-adapter-$adapter:0.1.0" --target "adapter-$adapter"
done
build docker/Dockerfile.eureka ghcr.io/example/mcp-demo-eureka-server:0.1.0
