#!/usr/bin/env bash
# Installs Debian's podman (with runc and buildah), debootstrap and jq for the container tests
# (tests/containers, tests/tests/containers.rs): podman builds and runs the images, debootstrap
# makes the Debian root file system the stand-in images start from, jq is what docker/README.md's
# walkthrough pipes istiod's registryz through. Idempotent: does nothing when all are there.
# The engine's settings are the tests' own (tests/containers/containers.conf), never /etc's.
set -euo pipefail

missing=()
for tool in podman runc buildah debootstrap jq; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends podman runc buildah debootstrap jq \
  netavark aardvark-dns iptables
