"""The one exception the wire codec raises for input it cannot represent."""


class WireError(ValueError):
    """A frame or packet is malformed; `reason` says why in a few words."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class NotBatmanError(WireError):
    """The Ethernet frame is well formed but is not batman-adv (ethertype != 0x4305)."""
