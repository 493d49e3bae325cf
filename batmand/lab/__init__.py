"""netns-lab: meshes of batmand nodes in network namespaces, built from TOML topologies.

    from batmand.lab import Lab, down

    with Lab("line5", prefix="demo") as lab:     # namespaces demo-n1 .. demo-n5, veths e-<peer>
        lab.start()                               # batmand in every node, then bat0 addresses
        print(lab.batmanctl("n1", "o").stdout)
        lab.exec("n1", ["ping", "-c3", lab.address("n5")])
    down("demo")                                  # removes leftovers by prefix, e.g. after a crash

Command line: `python -m batmand.lab up|down|exec|show|start|stop|loss|link|list`.
"""

from .lab import DEFAULT_LAB_ROOT, DEFAULT_RUN_ROOT, Lab, LabError, down, format_status, list_labs
from .net import NetError
from .topology import SHIPPED_DIR, Client, Link, Node, Topology, TopologyError, from_dict, load, shipped_names

__all__ = [
    "DEFAULT_LAB_ROOT", "DEFAULT_RUN_ROOT", "SHIPPED_DIR", "Client", "Lab", "LabError", "Link", "NetError", "Node",
    "Topology", "TopologyError", "down", "format_status", "from_dict", "list_labs", "load", "shipped_names",
]
