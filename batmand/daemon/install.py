"""`batmand install-unit`: the systemd unit and a sample configuration with every key."""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
from pathlib import Path

from batmand.core.config import MeshConfig

UNIT = Path(__file__).resolve().parent.parent.parent / "systemd" / "batmand@.service"
PACKAGED_UNIT = Path(__file__).resolve().parent / "batmand@.service"


def sample_config() -> str:
    """Every configuration key with its default (the kernel's, where the kernel has one)."""
    lines = ["# /etc/batmand/<meshif>.toml - batmand settings for one mesh interface.",
             "# Every key may also be given as `batmand --set key=value`. Defaults are shown.", "",
             '# interfaces = ["eth0"]        # hard interfaces; the first is the primary',
             '# state_dir = "/var/lib/batmand"',
             '# control_group = ""          # a group that may use the control socket (mode 0660)',
             "# control_max_request = 65536", "",
             '# The data plane (see README, "The data plane"):',
             '# workers = "auto"            # worker processes, one per CPU; 0 runs the data plane inline',
             "# gro = true                  # coalesce TCP segments delivered to the host into GSO frames",
             "# tso = true                  # accept TSO super-frames from the host, segment them in the workers",
             "# csum_offload = true         # leave partial checksums to the kernel (TAP and the hard interfaces)",
             '# rx_ring = "v2"              # PACKET_MMAP receive ring: v2 (a wake-up per burst) or v3 (block timer)',
             ""]
    for f in dataclasses.fields(MeshConfig):
        value = f.default
        text = f'"{value}"' if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else value
        lines.append(f"# {f.name} = {text}")
    lines += ["", "# per hard interface (B.A.T.M.A.N. V metric, ELP, penalty):",
              "# [hardif.eth0]", '# throughput_override = "0"   # e.g. "100mbit"; 0 = estimate',
              "# elp_interval = 500", "# hop_penalty = 0", ""]
    return "\n".join(lines)


def unit_text(executable: str) -> str:
    source = UNIT if UNIT.exists() else PACKAGED_UNIT
    return source.read_text().replace("/usr/local/bin/batmand", executable)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="batmand install-unit", description=__doc__)
    p.add_argument("--unit-dir", default="/etc/systemd/system")
    p.add_argument("--config-dir", default="/etc/batmand")
    args = p.parse_args(argv)
    executable = shutil.which("batmand") or os.path.join(os.path.dirname(sys.executable), "batmand")
    unit = Path(args.unit_dir) / "batmand@.service"
    unit.parent.mkdir(parents=True, exist_ok=True)
    unit.write_text(unit_text(executable))
    config = Path(args.config_dir)
    config.mkdir(parents=True, exist_ok=True)
    (config / "batmand.toml.example").write_text(sample_config())
    print(f"installed {unit} (ExecStart {executable}) and {config / 'batmand.toml.example'}")
    print("next: write /etc/batmand/bat0.toml, then `systemctl daemon-reload && systemctl enable --now batmand@bat0`")
    return 0
