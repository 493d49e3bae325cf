"""A deterministic discrete-event simulator for meshes of protocol cores (no I/O)."""

from .network import Network, SimNode

__all__ = ["Network", "SimNode"]
