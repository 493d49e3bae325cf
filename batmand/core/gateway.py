"""Gateway mode (the kernel's gateway_common.c, gateway_client.c and the DHCP branch of
mesh-interface.c's batadv_interface_tx).

A server announces its uplink bandwidth in a GW container of its OGMs. A client keeps the
list of gateways those containers announce, selects one with the routing algorithm's
gateway operations (the metric, the best gateway, whether a newly heard one is worth a new
election) and sends the DHCP requests its hosts broadcast to that gateway only, as
UNICAST_4ADDR DATA, so that the gateway learns the host as a client of ours. Elections run
in the originator worker (every second), when something asked for one. Selecting,
changing and losing the gateway are announced as uevents (Uevent actions)."""

from __future__ import annotations

from dataclasses import dataclass

from batmand.wire import GatewayTvlv, InnerFrame, Mac
from batmand.wire.constants import TvlvType

from . import dhcp
from .config import SettingError
from .events import Uevent
from .hooks import GATEWAY_DHCP
from .originator import OrigNode

OFF, CLIENT, SERVER = "off", "client", "server"
KBIT_PER_UNIT = 100  # the GW container's bandwidths are in 100 kbit/s
GW_CONTAINER_SIZE = 4 + 8  # TVLV header, down and up
SETTINGS = ("gw_mode", "gw_sel_class", "gw_bandwidth_down", "gw_bandwidth_up")


@dataclass(eq=False)
class GatewayNode:
    """batadv_gw_node: an originator that announces itself as a gateway; bandwidths in
    100 kbit/s. `listed` turns False when it leaves the list (the selection may still
    point to it until the next election)."""

    orig_node: OrigNode
    bandwidth_down: int
    bandwidth_up: int
    listed: bool = True


def mbit(units: int) -> str:
    """100 kbit/s units as the kernel prints them: 10.0."""
    return f"{units // 10}.{units % 10}"


def resolve_sel_class(config, algo) -> None:
    """Fill in the algorithm's default selection class (batadv_gw_init's init_sel_class)
    and refuse one above the algorithm's maximum (IV: 255), naming the key."""
    if config.gw_sel_class is None:
        config.gw_sel_class = algo.gw_sel_class_default
    elif config.gw_sel_class > algo.gw_sel_class_max:
        raise SettingError(sel_class_out_of_range(config.gw_sel_class, algo))


def sel_class_out_of_range(value: int, algo) -> str:
    return f"gw_sel_class: {value} is out of range (1..{algo.gw_sel_class_max} for {algo.name})"


class Gateway:
    def __init__(self, mesh) -> None:
        self.mesh = mesh
        resolve_sel_class(mesh.config, mesh.algo)
        self.gateways: list[GatewayNode] = []  # newest first, as the kernel's list (ties go to the first)
        self._by_orig: dict[Mac, GatewayNode] = {}
        self.selected: GatewayNode | None = None
        self.reselect = False
        mesh.tvlv.handle_ogm(TvlvType.GW, GatewayTvlv.VERSION, self._ogm_container, when_absent=True,
                             each_copy=self._wants_each_copy)
        mesh.tvlv.contribute(self._container, reserve=GW_CONTAINER_SIZE)
        mesh.hooks.on_host_tx(GATEWAY_DHCP, self._host_tx)
        mesh.on_setting(SETTINGS, self._setting_changed, check=self._check_setting)
        mesh.on_originator_removed(self._originator_removed)
        mesh.on_purge(self.election)

    @property
    def mode(self) -> str:
        return self.mesh.config.gw_mode

    @property
    def sel_class(self) -> int:
        return self.mesh.config.gw_sel_class

    # --- server: our GW container ------------------------------------------------------------

    def _container(self, now: float, room: int) -> GatewayTvlv | None:
        """batadv_gw_tvlv_container_update: only a server announces (kbit/s to 100 kbit/s)."""
        if self.mode != SERVER:
            return None
        config = self.mesh.config
        return GatewayTvlv(config.gw_bandwidth_down // KBIT_PER_UNIT, config.gw_bandwidth_up // KBIT_PER_UNIT)

    # --- the gateway list ----------------------------------------------------------------------

    def _ogm_container(self, now: float, orig_node: OrigNode, tvlv: GatewayTvlv | None) -> None:
        """batadv_gw_tvlv_ogm_handler_v1, also for an OGM without the container (which
        says: no gateway). A zero bandwidth either way means no gateway."""
        down, up = (tvlv.bandwidth_down, tvlv.bandwidth_up) if tvlv is not None else (0, 0)
        if down == 0 or up == 0:
            down = up = 0
        self._node_update(orig_node, down, up)
        if down and self.mode == CLIENT:
            self._check_election(orig_node)

    def _wants_each_copy(self, tvlv: GatewayTvlv | None) -> bool:
        """A further copy of an OGM changes nothing in the list, only the TQ toward its
        originator, which a client's election check reads: a gateway's every copy, then."""
        return tvlv is not None and self.mode == CLIENT

    def _node_update(self, orig_node: OrigNode, down: int, up: int) -> None:
        """batadv_gw_node_update: add, change, or (bandwidth 0) remove its entry."""
        gw = self._by_orig.get(orig_node.orig)
        if gw is None:
            if down:
                gw = GatewayNode(orig_node, down, up)
                self.gateways.insert(0, gw)
                self._by_orig[orig_node.orig] = gw
                self.mesh.debug(f"Found new gateway {orig_node.orig} -> gw bandwidth: {mbit(down)}/{mbit(up)} MBit")
            return
        if (gw.bandwidth_down, gw.bandwidth_up) == (down, up):
            return
        self.mesh.debug(f"Gateway bandwidth of originator {orig_node.orig} changed from "
                        f"{mbit(gw.bandwidth_down)}/{mbit(gw.bandwidth_up)} MBit to {mbit(down)}/{mbit(up)} MBit")
        gw.bandwidth_down, gw.bandwidth_up = down, up
        if down == 0:
            self.mesh.debug(f"Gateway {orig_node.orig} removed from gateway list")
            self.gateways.remove(gw)
            del self._by_orig[orig_node.orig]
            gw.listed = False
            if gw is self.selected:
                self.reselect = True

    def _originator_removed(self, orig_node: OrigNode) -> None:
        """batadv_gw_node_delete: the originator timed out (or was evicted)."""
        self._node_update(orig_node, 0, 0)

    # --- client: the election -------------------------------------------------------------------

    def _check_election(self, orig_node: OrigNode) -> None:
        """batadv_gw_check_election: a gateway announced itself; elect again (at the next
        worker run) when none is selected or the algorithm says it is worth it."""
        current = self.selected
        if current is None:
            self.reselect = True
            return
        if current.orig_node is orig_node:
            return
        listed = self._by_orig.get(current.orig_node.orig) or GatewayNode(current.orig_node, 0, 0, listed=False)
        if self.mesh.algo.gw_is_eligible(listed, self._by_orig[orig_node.orig], self.sel_class):
            self.reselect = True

    def election(self, now: float) -> None:
        """batadv_gw_election, at the end of every originator worker run."""
        if self.mode != CLIENT:
            return
        current = self.selected
        asked, self.reselect = self.reselect, False
        if not asked and current is not None:
            return
        best = self.mesh.algo.gw_best(self.gateways, self.sel_class)
        if best is current:
            return
        if best is not None and self.mesh.algo.gw_metric(best.orig_node) is None:
            self.reselect = True  # no route to it after all: try again next time
            return
        if best is None:
            self.mesh.debug("Removing selected gateway - no gateway in range")
            self.mesh.emit(Uevent("gw", "del"))
        else:
            what = "Adding route to" if current is None else "Changing route to"
            self.mesh.debug(f"{what} gateway {best.orig_node.orig} (bandwidth: {mbit(best.bandwidth_down)}/"
                            f"{mbit(best.bandwidth_up)} MBit, {self.mesh.algo.metric_key}: "
                            f"{self.mesh.algo.gw_metric(best.orig_node)})")
            self.mesh.emit(Uevent("gw", "add" if current is None else "change", str(best.orig_node.orig)))
        self.selected = best

    def _check_setting(self, name: str, value) -> None:
        if name == "gw_sel_class" and value is not None and value > self.mesh.algo.gw_sel_class_max:
            raise SettingError(sel_class_out_of_range(value, self.mesh.algo))

    def _setting_changed(self, now: float, name: str, old) -> None:
        """As the kernel's netlink set: any gw_mode write elects again, and leaving client
        mode (or writing it again) with a gateway selected deselects it (a del uevent), so
        that the next selection is announced as an add; a new class elects again. The
        bandwidths are read when our next OGM is built."""
        if name == "gw_sel_class":
            resolve_sel_class(self.mesh.config, self.mesh.algo)
            self.reselect = True
        elif name == "gw_mode":
            self.reselect = True
            if old == CLIENT and self.selected is not None:  # batadv_gw_check_client_stop
                self.selected = None
                self.mesh.emit(Uevent("gw", "del"))

    # --- DHCP from the host (batadv_interface_tx) ------------------------------------------------

    def _host_tx(self, now: float, inner: InnerFrame, vid: int) -> bool:
        """In client or server mode, DHCP the host broadcasts is not flooded: requests go to
        the selected gateway (a server drops its own side's requests), replies to the
        originator that has the client (chaddr). Everything else goes on as before."""
        if self.mode == OFF or not inner.h_dest.is_multicast:
            return False
        kind, chaddr = dhcp.recipient(inner)
        if kind is None:
            return False
        mesh = self.mesh
        if kind == dhcp.TO_CLIENT:
            orig = mesh.tt.best_orig(chaddr, vid)
            mesh.routing.send_unicast_from_host(now, inner, mesh.originators.get(orig) if orig else None)
        elif self.mode == SERVER:
            mesh.counters["tx_dropped"] += 1  # gateways do not pass DHCP requests on to other servers
            mesh.counters.drop("gw_dhcp_request_at_server")
        else:
            selected = self.selected
            # batadv_gw_out_of_range would drop a request to a worse gateway, but the kernel
            # only asks it about frames to a multicast address, for which it always says no
            mesh.routing.send_unicast_from_host(now, inner, selected.orig_node if selected else None, four_addr=True)
        return True

    # --- what batmanctl shows ---------------------------------------------------------------------

    def rows(self) -> list[dict]:
        """batctl gwl: the listed gateways we have a route to (batctl's JSON keys); `best`
        marks the selected one."""
        rows = []
        for gw in self.gateways:
            router = gw.orig_node.router()
            metric = self.mesh.algo.gw_metric(gw.orig_node)
            if router is None or metric is None:
                continue
            rows.append({"orig_address": str(gw.orig_node.orig), self.mesh.algo.metric_key: metric,
                         "router": str(router.addr), "hard_ifname": router.if_incoming.name,
                         "bandwidth_down": gw.bandwidth_down, "bandwidth_up": gw.bandwidth_up,
                         "best": gw is self.selected})
        return rows

    def state(self) -> dict:
        """batctl gw: the mode and what goes with it (the kernel's GET_MESH attributes)."""
        config = self.mesh.config
        return {"gw_mode": self.mode, "gw_sel_class": self.sel_class, "algo": self.mesh.algo.name,
                "gw_bandwidth_down": config.gw_bandwidth_down // KBIT_PER_UNIT,
                "gw_bandwidth_up": config.gw_bandwidth_up // KBIT_PER_UNIT}
