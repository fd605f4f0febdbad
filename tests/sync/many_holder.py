"""Many locks held by one process and released together, driven over stdin/stdout.

Usage: ``python -m tests.sync.many_holder URL WATCHDOG_TIMEOUT``. Each line on
stdin is a command, each answer one JSON line:

* ``hold NAME...``: take every named lock (key prefix ``test``), answer
  ``{"held": N}``;
* ``release``: release them all, one after the other as fast as it can, and
  answer ``{"released_at": [...]}``: ``time.monotonic()`` just before each
  release, in the order of the names. On Linux and macOS that clock is the
  machine's, so the tests can compare it with their own.

It ends at the end of its input.
"""

from __future__ import annotations

import json
import sys
import time

from django_rlock.core import LockClient, RLock


def main() -> None:
    url, watchdog_timeout = sys.argv[1], float(sys.argv[2])
    with LockClient(url, key_prefix="test", watchdog_timeout=watchdog_timeout) as client:
        held: list[RLock] = []
        for line in sys.stdin:
            command, *names = line.split()
            if command == "hold":
                held = [client.lock(name) for name in names]
                for lock in held:
                    lock.acquire()
                print(json.dumps({"held": len(held)}), flush=True)
            elif command == "release":
                released_at = []
                for lock in held:
                    released_at.append(time.monotonic())
                    lock.release()
                held = []
                print(json.dumps({"released_at": released_at}), flush=True)


if __name__ == "__main__":
    main()
