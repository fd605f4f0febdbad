"""A semaphore holder in its own process, for the tests to SIGKILL.

Usage: ``python -m tests.sync.semaphore_holder URL NAME PERMITS TAKE WATCHDOG_TIMEOUT``.
It takes TAKE permits (watchdog-renewed), prints ``{"held": TAKE}``, then
sleeps until it is killed.
"""

from __future__ import annotations

import json
import sys
import time

from django_rlock.core import LockClient


def main() -> None:
    url, name, permits, take, watchdog_timeout = sys.argv[1:6]
    client = LockClient(url, key_prefix="test", watchdog_timeout=float(watchdog_timeout))
    semaphore = client.semaphore(name, int(permits))
    for _ in range(int(take)):
        if not semaphore.acquire(timeout=10):
            print(json.dumps({"held": semaphore.hold_count()}), flush=True)
            return
    print(json.dumps({"held": semaphore.hold_count()}), flush=True)
    time.sleep(600)  # until the test kills it


if __name__ == "__main__":
    main()
