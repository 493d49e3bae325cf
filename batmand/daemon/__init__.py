"""The batmand daemon: the I/O shell (asyncio on uvloop) around the protocol core."""
