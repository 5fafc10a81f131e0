#!/usr/bin/env bash
# Installs Debian's Prometheus (prometheus, promtool) and Alertmanager for the monitoring tests:
# tests/tests/monitoring_rules.rs runs `promtool check rules` and `promtool test rules` on
# deploy/helm/mcp-adapters/monitoring, and the end-to-end monitoring test runs both servers
# itself. Idempotent: does nothing when /usr/bin/promtool and /usr/bin/prometheus-alertmanager
# exist. Under systemd the packages also start their own services (ports 9090, 9093, ...): the
# tests do not use them, they start their own servers on free ports.
set -euo pipefail

if [ -x /usr/bin/promtool ] && [ -x /usr/bin/prometheus ] && [ -x /usr/bin/prometheus-alertmanager ]; then
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends prometheus prometheus-alertmanager

for bin in /usr/bin/promtool /usr/bin/prometheus /usr/bin/prometheus-alertmanager; do
    if [ ! -x "$bin" ]; then
        echo "install-prometheus.sh: $bin still missing after install" >&2
        exit 1
    fi
done
