"""batmand: the batman-adv mesh protocol (compat version 15) in userspace."""

__version__ = "0.1.0"
