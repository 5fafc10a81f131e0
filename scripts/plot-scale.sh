#!/usr/bin/env bash
# Plots target/scale/*.csv (written by `cargo bench -p e2e --bench scale`) into
# benchmarks/scale.png. matplotlib is not a system package here: the first run makes a venv in
# target/plot-venv and installs it from PyPI; later runs reuse it.
# Usage: scripts/plot-scale.sh [CSV_DIR] [OUTPUT]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/target/plot-venv"

if ! "$venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check matplotlib
fi
exec "$venv/bin/python" "$root/scripts/plot_scale.py" "$@"
