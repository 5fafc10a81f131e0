# Sourced by tests/containers/build.sh and build-images.sh.
#   standin_podman ARGS...   podman with the tests' containers.conf (CONTAINERS_CONF)
#   standin_cache            the directory of what a fresh clone must not rebuild (the Debian
#                            root file system the stand-ins start from): outside target/,
#                            MCP_CONTAINERS_CACHE or ~/.cache/mcp-bridge-containers
containers_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_dir="$(cd "$containers_dir/../.." && pwd)"
export CONTAINERS_CONF="$containers_dir/containers.conf"
standin_cache="${MCP_CONTAINERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mcp-bridge-containers}"

standin_podman() {
  podman "$@"
}

# image_of RECIPE_DIR: the upstream name the recipe is tagged with (its `# image:` line).
image_of() {
  sed -n 's/^# image: *//p' "$1/Containerfile" | head -n 1
}
