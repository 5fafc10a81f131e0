#!/usr/bin/env bash
# Installs Debian's ZooKeeper (server jar + CLI classes) for the adapter-zookeeper
# e2e tests. Idempotent: does nothing when /usr/share/java/zookeeper.jar exists.
# Only the `zookeeper` package is installed (NOT `zookeeperd`, which would start
# a system service); the tests run their own standalone servers.
set -euo pipefail

if [ -f /usr/share/java/zookeeper.jar ]; then
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends zookeeper

if [ ! -f /usr/share/java/zookeeper.jar ]; then
    echo "install-zookeeper.sh: /usr/share/java/zookeeper.jar still missing after install" >&2
    exit 1
fi
