"""Entry point of the `batmand` console script: runs one mesh interface in the foreground."""

from __future__ import annotations

import logging
import sys

from batmand.daemon.options import OptionsError, load
from batmand.daemon.service import AlreadyRunning, Service


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["install-unit"]:
        from batmand.daemon.install import main as install

        return install(argv[1:])
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="batmand[%(name)s] %(levelname)s %(message)s")
    try:
        options = load(argv)
    except OptionsError as exc:
        print(f"batmand: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop

        uvloop.run(Service(options).run())
    except AlreadyRunning as exc:
        print(f"batmand: {exc}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"batmand: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
