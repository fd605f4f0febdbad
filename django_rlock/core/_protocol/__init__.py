"""The lock protocol, with no I/O: no socket, no thread, no event loop."""
