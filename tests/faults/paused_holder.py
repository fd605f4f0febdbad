"""A lock holder in its own process, to be paused with SIGSTOP by the tests.

Usage: ``python -m tests.faults.paused_holder URL NAME WATCHDOG_TIMEOUT DB``.
It takes the lock (watchdog lease), writes to the fenced resource at ``DB``
with its token and prints ``{"token": N}``. On the line ``go`` it reports, in
this order, what a careful holder does after an unexplained gap: whether the
lock is lost, whether a fenced write with its token is accepted, and what
release says.
"""

from __future__ import annotations

import json
import sys

from django_rlock.core import LockClient, LockLostError
from tests.faults.fencing import FencedResource


def main() -> None:
    url, name, watchdog_timeout, db = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    resource = FencedResource(db)
    with LockClient(url, key_prefix="f", watchdog_timeout=watchdog_timeout) as client:
        lock = client.lock(name)
        lock.acquire()
        token = lock.token
        resource.write(name, "first holder", token=token)
        print(json.dumps({"token": token}), flush=True)
        for line in sys.stdin:
            if line.strip() != "go":
                continue
            lost_before_release = lock.lost
            accepted = resource.write(name, "first holder, after the pause", token=token)
            try:
                lock.release()
                release = "released"
            except LockLostError:
                release = "LockLostError"
            report = {"lost": lost_before_release, "write_accepted": accepted, "release": release}
            print(json.dumps(report), flush=True)
            break
    resource.close()


if __name__ == "__main__":
    main()
