"""A lock holder in its own process, driven by the tests over stdin/stdout.

Usage: ``python -m tests.sync.holder URL NAME WATCHDOG_TIMEOUT``. It takes the
lock, prints ``{"token": N}``, then answers each ``report`` line on stdin with
what it saw: whether the lock is lost, whether ``on_lost`` ran, what release did.
"""

from __future__ import annotations

import json
import sys
import threading

from django_rlock.core import LockClient, LockLostError, LockNotOwnedError


def main() -> None:
    url, name, watchdog_timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
    client = LockClient(url, key_prefix="test", watchdog_timeout=watchdog_timeout)
    lock = client.lock(name)
    lost_called = threading.Event()
    lock.on_lost(lambda _lock: lost_called.set())
    lock.acquire()
    token = lock.token
    print(json.dumps({"token": token}), flush=True)
    for line in sys.stdin:
        if line.strip() != "report":
            continue
        lost = lock.lost
        ran = lost_called.wait(5)
        try:
            lock.release()
            outcome = "released"
        except LockLostError:
            outcome = "LockLostError"
        except LockNotOwnedError:
            outcome = "LockNotOwnedError"
        print(json.dumps({"lost": lost, "on_lost_ran": ran, "release": outcome, "token": token}))
        sys.stdout.flush()
        break
    client.close()


if __name__ == "__main__":
    main()
