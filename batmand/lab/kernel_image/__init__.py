"""The guest image of netns-lab's kernel nodes: Debian's own kernel (with its in-tree
batman-adv module) and batctl, in a busybox initramfs that QEMU boots.

    .venv/bin/python -m batmand.lab kernel-image build     # what scripts/kernel-node-setup.sh runs
    .venv/bin/python -m batmand.lab kernel-image show      # the cached image and the accelerator

Everything comes from Debian packages: the kernel package that `linux-image-amd64` depends on,
batctl, iperf3 and alfred (with batadv-vis) and the shared libraries they need, fetched with `apt-get download` (never
installed on the host), plus the host's static busybox (busybox-static). The result lives in
the cache directory (default /var/cache/batmand-kernel-node, env BATMAND_KERNEL_NODE_CACHE):

    debs/              the downloaded packages (only the current versions are kept)
    vmlinux            the kernel, uncompressed from the bzImage: QEMU boots it through its PVH
                       entry point, which saves the guest's own decompression (half the boot
                       under TCG); vmlinuz is kept as the fallback when there is no PVH note
    base.cpio.gz       busybox, batctl, iperf3, alfred, libraries and loader, kernel modules
    init.cpio.gz       /init (kernel_guest_init.sh) and the image's version file
    initrd.img         both, concatenated (the kernel unpacks one cpio after the other)
    image.json         what was built from what; a build is skipped when nothing changed
    accel.json         the accelerator that works here (KVM is probed once, TCG is the fallback)

The base is rebuilt only when a package version, the host's busybox or the builder's code
(builder.BUILDER_SOURCES) changes; the small init archive whenever kernel_guest_init.sh changes.
Standard library only (the archive writer, ELF reading and module dependency resolution are
done here), apart from apt-get/apt-cache/dpkg-deb and qemu for the probe.

    image.py      Image, load_image(), cache_dir(), ImageError: the image the cache holds
    builder.py    build(): what changed since the last build, download, rebuild
    initramfs.py  what the guest gets: base.cpio.gz (busybox, tools, libraries, modules), /init
    apt.py        Debian packages: candidates, apt-get download, dpkg-deb -x
    modules.py    depmod and the order to load kernel modules in
    elf.py        ELF reading (libraries, loader, notes, .modinfo), vmlinux out of a bzImage
    cpio.py       the newc archive writer
    probe.py      KVM or TCG (accel.json), QEMU's accelerator arguments
    cli.py        build / show
"""

from .builder import build
from .cli import main
from .cpio import Cpio
from .image import CACHE_ENV, DEFAULT_CACHE, Image, ImageError, cache_dir, load_image
from .probe import QEMU, accel_args, load_accel, probe_accel

__all__ = [
    "CACHE_ENV", "DEFAULT_CACHE", "QEMU", "Cpio", "Image", "ImageError", "accel_args", "build", "cache_dir",
    "load_accel", "load_image", "main", "probe_accel",
]
