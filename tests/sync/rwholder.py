"""A read-write lock holder in its own process, for the tests to kill.

Usage: ``python -m tests.sync.rwholder URL NAME WATCHDOG_TIMEOUT read|write``.
It takes that side of the lock (watchdog-renewed), prints ``{"token": N}``,
then waits on stdin until it is killed.
"""

from __future__ import annotations

import json
import sys

from django_rlock.core import LockClient


def main() -> None:
    url, name, watchdog_timeout, side = sys.argv[1:5]
    client = LockClient(url, key_prefix="test", watchdog_timeout=float(watchdog_timeout))
    lock = client.read_write_lock(name)
    held = lock.read if side == "read" else lock.write
    held.acquire()
    print(json.dumps({"token": held.token}), flush=True)
    sys.stdin.read()  # until the test kills this process (or closes stdin)
    client.close()


if __name__ == "__main__":
    main()
