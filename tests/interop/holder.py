"""A Python holder of a lock shared with Redisson, in its own process, to be killed.

Usage: ``python -m tests.interop.holder URL NAME WATCHDOG_TIMEOUT``. It takes
the lock with ``layout="redisson"`` (the watchdog renews it), prints
``{"token": N}`` and then waits until it is killed: a SIGKILL stops its
watchdog with it, as a crash would.
"""

from __future__ import annotations

import json
import sys
import threading

from django_rlock.core import LockClient


def main() -> None:
    url, name, watchdog_timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
    client = LockClient(url, layout="redisson", watchdog_timeout=watchdog_timeout)
    lock = client.lock(name)
    lock.acquire()
    print(json.dumps({"token": lock.token}), flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
