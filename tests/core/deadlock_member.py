"""One member of a deadlock, in its own process, driven by the tests over stdin/stdout.

Usage: ``python -m tests.core.deadlock_member URL FIRST SECOND DEADLOCK_TIMEOUT``.
It takes FIRST, prints ``{"held": true}``, waits for a ``go`` line, then takes
SECOND (waiting as long as it takes) and prints what happened:
``{"outcome": "granted" | "deadlock", "seconds": ..., "cycle": [...]}``, and
releases what it holds.
"""

from __future__ import annotations

import json
import sys
import time

from django_rlock.core import DeadlockError, LockClient


def main() -> None:
    url, first, second, deadlock_timeout = sys.argv[1:5]
    client = LockClient(url, key_prefix="test", deadlock_timeout=float(deadlock_timeout))
    held = client.lock(first)
    held.acquire()
    print(json.dumps({"held": True}), flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    began = time.monotonic()
    wanted = client.lock(second)
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
