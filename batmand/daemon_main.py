"""Entry point of the `batmand` console script: runs one mesh interface in the foreground."""

from __future__ import annotations

import logging
import logging.handlers
import sys

from batmand.daemon.options import LOG_FILE_BYTES, OptionsError, load
from batmand.daemon.service import AlreadyRunning, Service


LOG_FORMAT = "batmand[%(name)s] %(levelname)s %(message)s"


def _log_to(path: str | None) -> None:
    """stderr (the journal under systemd), or a file kept small by rotation."""
    if path is None:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format=LOG_FORMAT)
        return
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=LOG_FILE_BYTES // 2, backupCount=1)
    handler.setFormatter(logging.Formatter("%(asctime)s " + LOG_FORMAT))
    logging.basicConfig(level=logging.INFO, handlers=[handler])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["install-unit"]:
        from batmand.daemon.install import main as install

        return install(argv[1:])
    try:
        options = load(argv)
    except OptionsError as exc:
        print(f"batmand: {exc}", file=sys.stderr)
        return 2
    _log_to(options.log_file)
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
