#!/usr/bin/env bash
# Idempotent set-up for a Debian 12 machine, run as root: the apt packages the
# daemon, the lab and the tests need, and a virtualenv in .venv with batmand
# installed in editable mode together with its test dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(python3 python3-venv python3-dev gcc iproute2 tshark nftables iputils-ping iperf3
              # kernel nodes (scripts/kernel-node-setup.sh): QEMU, the guest's static busybox,
              # depmod for the downloaded kernel's modules; cpio for a test of our archives
              qemu-system-x86 busybox-static kmod cpio
              # the unit's seccomp restrictions, applied without systemd (tests/daemon/unit_sandbox.py)
              python3-seccomp
              # tests: the state file's writes traced (strace), a daemon's address space capped (prlimit)
              strace util-linux
              # gateway tests: a DHCP server in a namespace (the binary only, no system service)
              dnsmasq-base
              # topology tests: alfred and its batadv-vis client; graphviz's dot for batmanctl topology --png
              alfred graphviz)

./scripts/apt-install.sh setup "${APT_PACKAGES[@]}"

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
    echo "setup: creating .venv with $($PYTHON --version)"
    rm -rf .venv
    "$PYTHON" -m venv .venv
fi
# Reinstall only when pyproject.toml changed since the last successful install.
stamp=.venv/.batmand-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "setup: installing batmand and its Python dependencies into .venv"
    .venv/bin/pip install -q --upgrade pip
    # setuptools reminds every editable install that a same-named folder takes precedence:
    # that is the point of one, so the reminder is left out (other warnings still show)
    PYTHONWARNINGS="ignore:Editable installation" .venv/bin/pip install -q -e '.[test]'
    touch "$stamp"
fi

# The kernel nodes' VM image (downloaded and built once, then cached). A failure here does
# not stop the set-up: the interop tests then skip and print why (build-error.txt).
export BATMAND_SETUP_RUNNING=1
if ! ./scripts/kernel-node-setup.sh; then
    echo "setup: WARNING: the kernel-node image could not be built; interop tests will be skipped" >&2
fi
echo "setup: ready ($(.venv/bin/python --version))"
