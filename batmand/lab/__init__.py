"""netns-lab: meshes of batmand nodes in network namespaces, built from TOML topologies.

    from batmand.lab import Lab, down

    with Lab("line5", prefix="demo") as lab:     # namespaces demo-n1 .. demo-n5, veths e-<peer>
        lab.start()                               # batmand in every node, then bat0 addresses
        print(lab.batmanctl("n1", "o").stdout)
        lab.exec("n1", ["ping", "-c3", lab.address("n5")])
    down("demo")                                  # removes leftovers by prefix, e.g. after a crash

Kernel nodes (`kind = "kernel"`: the Linux kernel's batman-adv in a QEMU VM) take part like
any other node; `lab.exec(node, ["batctl", "o"])` then runs in the VM. `kernel_nodes_available()`
says whether they can run here (the image is built by scripts/kernel-node-setup.sh).

Command line: `python -m batmand.lab up|down|exec|show|start|stop|loss|link|list|kernel-image`.
"""

from .kernel_node import KernelNodeError, kernel_nodes_available
from .lab import DEFAULT_LAB_ROOT, DEFAULT_RUN_ROOT, Lab, LabError, down, format_status, list_labs
from .net import NetError
from .topology import SHIPPED_DIR, Client, Link, Node, Topology, TopologyError, from_dict, load, shipped_names

__all__ = [
    "DEFAULT_LAB_ROOT", "DEFAULT_RUN_ROOT", "SHIPPED_DIR", "Client", "KernelNodeError", "Lab", "LabError", "Link",
    "NetError", "Node", "kernel_nodes_available",
    "Topology", "TopologyError", "down", "format_status", "from_dict", "list_labs", "load", "shipped_names",
]
