"""Lock backends, one file each, named in RLOCKS[alias]["BACKEND"] like cache backends.

The underscored modules are what a backend hands out (the alias's locks,
fair and read-write locks, semaphores, rate limiters, thread-run wrappers and
per-loop clients) and the types they share (``_types``); not a user's API.
"""
