#!/usr/bin/env bash
# Idempotent extra set-up for the data-plane benchmark (bench/dataplane.py), run as root
# after scripts/setup.sh: the peers it compares against (tinc 1.0, fastd), iperf3, ethtool,
# and matplotlib in .venv (the "bench" optional dependencies) for the chart.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(iperf3 tinc fastd ethtool iputils-ping iproute2)

./scripts/apt-install.sh bench-setup "${APT_PACKAGES[@]}"

# tinc and fastd ship system services; the benchmark starts its own daemons inside
# namespaces and needs none running in the root namespace.
for unit in tinc.service fastd.service; do
    if systemctl is-enabled "$unit" >/dev/null 2>&1; then
        systemctl disable --now "$unit" >/dev/null 2>&1 || true
    fi
done

if [ ! -x .venv/bin/python ]; then
    echo "bench-setup: .venv is missing; run scripts/setup.sh first" >&2
    exit 1
fi
stamp=.venv/.batmand-bench-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || ! .venv/bin/python -c 'import matplotlib' 2>/dev/null || [ ! -x .venv/bin/py-spy ]; then
    echo "bench-setup: installing the bench extras (matplotlib, py-spy) into .venv"
    .venv/bin/pip install -q -e '.[test,bench]'
    touch "$stamp"
fi
echo "bench-setup: ready"
