"""The protocol core: sans-I/O state machines for batman-adv.

Nothing here opens a socket or reads a clock. Callers pass `now` (seconds, float) and
frames in, and get actions out (frames to transmit, frames to deliver to the soft
interface, published forwarding-table changes)."""
