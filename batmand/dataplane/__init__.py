"""The fast data plane: per-worker engines that move unicast frames between the TAP
queues and the hard interfaces, and the control process's side that runs them."""
