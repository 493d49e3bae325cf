"""A package whose __init__ runs only when its own namespace is used.

pyroute2's __init__ imports every API it has (IPRoute, NDB with sqlite3, IPDB, IPVS,
WireGuard, ...: about 8 MB of RSS); the daemon needs only its netlink message classes,
which are submodules. crc32c's __init__ reads its own version through importlib.metadata
(1.6 MiB); we need only its C function. Registered this way, `import pyroute2.netlink.rtnl`
loads just those, while `from pyroute2 import IPRoute` (tools and tests in the same
process) still works: the first lookup of a name in the package runs its __init__ then."""

from __future__ import annotations

import importlib
import importlib.util
import sys


def register(name: str) -> None:
    """Put package `name` in sys.modules without running its __init__ yet (nothing to do
    if it is imported already)."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        return  # not installed, or no package: the ordinary import reports it
    module = importlib.util.module_from_spec(spec)

    def __getattr__(attr: str):
        if not attr.startswith("__") and importlib.util.find_spec(f"{name}.{attr}") is not None:
            return importlib.import_module(f"{name}.{attr}")  # `from pyroute2 import config`: a submodule
        del module.__getattr__  # once: the __init__ fills the namespace
        spec.loader.exec_module(module)
        try:
            return module.__dict__[attr]
        except KeyError:
            raise AttributeError(f"module {name!r} has no attribute {attr!r}") from None

    module.__getattr__ = __getattr__
    sys.modules[name] = module
