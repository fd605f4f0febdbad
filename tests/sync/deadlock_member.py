"""One member of a deadlock, in its own process, driven by the tests over stdin/stdout.

Usage: ``python -m tests.sync.deadlock_member URL FIRST SECOND DEADLOCK_TIMEOUT``.
FIRST and SECOND are lock names, or ``KIND:name`` for another kind (``fair``,
``read``, ``write`` of a read-write lock, ``semN`` a semaphore of N permits).
It takes FIRST, prints ``{"held": true}``, waits for a ``go`` line, then takes
SECOND (waiting as long as it takes) and prints what happened:
``{"outcome": "granted" | "deadlock", "seconds": ..., "cycle": [...]}``, and
releases what it holds.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from django_rlock.core import DeadlockError, LockClient


def lock_of(client: LockClient, spec: str) -> Any:
    """The lock a FIRST or SECOND argument names."""
    kind, _, name = spec.partition(":")
    if not name:
        return client.lock(spec)
    if kind == "fair":
        return client.fair_lock(name)
    if kind in ("read", "write"):
        return getattr(client.read_write_lock(name), kind)
    if kind.startswith("sem"):
        return client.semaphore(name, int(kind[3:]))
    raise ValueError(f"unknown kind {kind!r}")


def main() -> None:
    url, first, second, deadlock_timeout = sys.argv[1:5]
    client = LockClient(url, key_prefix="test", deadlock_timeout=float(deadlock_timeout))
    held = lock_of(client, first)
    held.acquire()
    print(json.dumps({"held": True}), flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    began = time.monotonic()
    wanted = lock_of(client, second)
    try:
        wanted.acquire()
    except DeadlockError as error:
        answer: dict[str, object] = {
            "outcome": "deadlock",
            "cycle": list(error.cycle),
            "message": str(error),
        }
    else:
        answer = {"outcome": "granted"}
        wanted.release()
    answer["seconds"] = time.monotonic() - began
    held.release()
    print(json.dumps(answer), flush=True)
    client.close()


if __name__ == "__main__":
    main()
