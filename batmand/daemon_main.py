"""Entry point of the `batmand` console script. The daemon itself arrives with the daemon
issue; until then the command says so instead of pretending to run."""

import sys


def main() -> int:
    print("batmand: the daemon is not built yet; `batmanctl td` decodes batman-adv traffic", file=sys.stderr)
    return 1
