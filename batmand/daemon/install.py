"""`batmand install-unit`: the systemd unit and a sample configuration with every key."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from batmand.core.config import HARDIF_SETTINGS, MESH_SETTINGS

from .options import DAEMON_SETTINGS

UNIT = Path(__file__).resolve().parent.parent.parent / "systemd" / "batmand@.service"
PACKAGED_UNIT = Path(__file__).resolve().parent / "batmand@.service"


def sample_config() -> str:
    """Every configuration key with its default (the kernel's, where the kernel has one), what
    it allows and whether a change needs a restart: written from the settings schema."""
    lines = ["# /etc/batmand/<meshif>.toml - batmand settings for one mesh interface.",
             "# Every key may also be given as `batmand --set key=value`. Defaults are shown, then",
             "# what a key allows; [restart]: a change takes effect after a restart, the others on SIGHUP.", ""]
    for settings in (DAEMON_SETTINGS, MESH_SETTINGS):
        for s in settings.values():
            if not s.implemented:
                continue
            if s.spec.section:
                lines += ["", f"# {s.spec.section}"]
            lines.append(_sample_line(s))
        lines.append("")
    # listed, so that someone coming from batctl finds them, but not as `key = value`: a file
    # with one of them is refused, so an uncommented line must not be one
    missing = [s for settings in (DAEMON_SETTINGS, MESH_SETTINGS) for s in settings.values() if not s.implemented]
    if missing:
        lines.append("# Not implemented yet (refused until they are):")
        lines += [f"#   {s.name}: {s.spec.help}; the kernel's default: {_toml(s.default)}" for s in missing]
        lines.append("")
    lines += ["# per hard interface:", "# [hardif.eth0]"]
    lines += [_sample_line(s) for s in HARDIF_SETTINGS.values()]
    return "\n".join(lines + [""])


def _sample_line(s) -> str:
    value = s.spec.example if s.spec.example is not None else _toml(s.default)
    about = "; ".join(part for part in (s.spec.help, s.allowed.describe()) if part)
    return f"# {s.name} = {value}".ljust(42) + f"  # {about}" + ("" if s.live else " [restart]")


def _toml(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


HOME_DIRS = ("/root", "/home", "/run/user")  # what ProtectHome=yes hides from the service


def _interpreter(executable: str) -> str | None:
    """The #! interpreter of a console script (a venv's python)."""
    try:
        with open(executable, "rb") as f:
            first = f.readline(4096)
    except OSError:
        return None
    words = first[2:].split() if first.startswith(b"#!") else []
    return words[0].decode(errors="replace") if words else None


def paths_in_home(executable: str) -> list[str]:
    """What the service runs from that lies in a home directory: the script, its interpreter
    (symlinks followed: a venv's python may point into ~/.pyenv) and this batmand package."""
    candidates = [executable, os.path.realpath(executable), str(Path(__file__).resolve().parent.parent)]
    interpreter = _interpreter(executable)
    if interpreter:
        candidates += [interpreter, os.path.realpath(interpreter)]
    return sorted({c for c in candidates if any(c == h or c.startswith(h + "/") for h in HOME_DIRS)})


def unit_text(executable: str) -> str:
    source = UNIT if UNIT.exists() else PACKAGED_UNIT
    text = source.read_text().replace("/usr/local/bin/batmand", executable)
    home = paths_in_home(executable)
    if home:  # ProtectHome=yes would hide the program itself and the service could not start
        text = text.replace("ProtectHome=yes\n", f"# read-only, not hidden: batmand runs from {', '.join(home)}\n"
                            "ProtectHome=read-only\n")
    return text


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
    home = paths_in_home(executable)
    if home:
        print(f"note: ProtectHome=read-only instead of yes, since batmand runs from {', '.join(home)}: the "
              "service can read (not write) home directories. Install batmand outside /root, /home and "
              "/run/user (e.g. a venv in /opt/batmand) to hide them.")
    print("next: write /etc/batmand/bat0.toml, then `systemctl daemon-reload && systemctl enable --now batmand@bat0`")
    return 0
