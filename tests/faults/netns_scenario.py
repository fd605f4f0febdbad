"""The partition scenario inside a private network namespace (run by test_netns.py).

Usage: ``unshare -n python -m tests.faults.netns_scenario``. The namespace has
its own loopback; taking it down cuts every connection the way a real
partition does (the kernel, not a proxy, drops the packets). Prints one JSON
line: how the holder heard of the loss, measured against its deadline.
"""

from __future__ import annotations

import json
import subprocess
import time

from django_rlock.core import LockClient, LockLostError
from tests.faults.conftest import TIMEOUT
from tests.faults.recorder import LockWatch, current_hold
from tests.servers import RedisServer


def _loopback(state: str) -> None:
    subprocess.run(["ip", "link", "set", "lo", state], check=True, timeout=10)


def main() -> None:
    _loopback("up")
    with (
        RedisServer() as server,
        LockClient(server.url, key_prefix="f", watchdog_timeout=TIMEOUT) as client,
    ):
        lock = client.lock("netns")
        assert lock.acquire()
        watch = LockWatch(lock)
        watch.wait_for_renewal()
        deadline = current_hold(lock).deadline
        down_at = time.monotonic()
        _loopback("down")
        told = watch.lost.wait(3 * TIMEOUT)
        # The last renewal before the cut may have moved the deadline on.
        deadline = max(deadline, current_hold(lock).deadline)
        time.sleep(max(0.0, down_at + 2 * TIMEOUT - time.monotonic()))
        _loopback("up")
        try:
            lock.release()
            release = "released"
        except LockLostError:
            release = "LockLostError"
        report = {
            "told": told,
            "late_by": None if watch.lost_at is None else watch.lost_at - deadline,
            "longest_renewal": watch.longest_renewal(),
            "release": release,
        }
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
