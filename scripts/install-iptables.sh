#!/usr/bin/env bash
# Installs Debian's iptables for the traffic test that captures outbound connections the way an
# Istio sidecar's init container does (REDIRECT to 15001), inside a network namespace of its own.
# Idempotent: does nothing when iptables is on the PATH.
set -euo pipefail

if command -v iptables >/dev/null 2>&1; then
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y --no-install-recommends iptables || {
    $SUDO apt-get update
    $SUDO apt-get install -y --no-install-recommends iptables
}
command -v iptables >/dev/null 2>&1 || {
    echo "install-iptables.sh: iptables still missing after install" >&2
    exit 1
}
