#!/usr/bin/env bash
# The VM image of netns-lab's kernel nodes (the Linux kernel's batman-adv as a test peer),
# built once and cached: Debian's kernel package (the one linux-image-amd64 depends on),
# batctl, iperf3, alfred (batadv-vis) and their libraries, fetched with `apt-get download` (nothing of it is
# installed on this machine), the host's static busybox, and our guest /init, packed into
# an initramfs; the kernel uncompressed for QEMU's fast PVH boot. Also finds out once
# whether KVM can run the guest here (else TCG). Idempotent: does nothing when nothing
# changed. Run as root. See batmand/lab/kernel_image/.
#
#   scripts/kernel-node-setup.sh              # build / bring up to date
#   scripts/kernel-node-setup.sh --force      # rebuild everything
#   scripts/kernel-node-setup.sh --reprobe    # probe KVM/TCG again
#
# Cache: /var/cache/batmand-kernel-node (env BATMAND_KERNEL_NODE_CACHE).
# The host packages it needs (qemu-system-x86, busybox-static, kmod, ...) are in the
# APT_PACKAGES list of scripts/setup.sh, which also calls this script at its end.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=""
for tool in qemu-system-x86_64 depmod dpkg-deb apt-get; do
    command -v "$tool" > /dev/null || missing="$missing $tool"
done
[ -x /bin/busybox ] || missing="$missing /bin/busybox"
[ -x .venv/bin/python ] || missing="$missing .venv"
if [ -n "$missing" ]; then
    if [ -n "${BATMAND_SETUP_RUNNING:-}" ]; then
        echo "kernel-node-setup: still missing after scripts/setup.sh:$missing" >&2
        exit 1
    fi
    echo "kernel-node-setup: missing$missing: running scripts/setup.sh first (it comes back here)" >&2
    exec ./scripts/setup.sh
fi
exec .venv/bin/python -m batmand.lab kernel-image build "$@"
