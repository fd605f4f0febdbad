"""What the fair lock's tests share: bounded waits on the queue, and a head killed in it.

A fair lock's queue is a sorted set on the server; the tests watch it to know
where their waiters are. A waiter killed while queued leaves its entry behind
(until the entry's end, about the watchdog timeout), as a crashed process's would.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Callable

import redis

from django_rlock.core import FairLock
from django_rlock.core.aio import AsyncFairLock

HANG = 15.0  # seconds: only reached when something hangs


def wait_until(check: Callable[[], bool], what: str) -> None:
    """Poll ``check`` until it holds (a test's own bounded wait, never the lock's)."""
    deadline = time.monotonic() + HANG
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.01)


def queued(r: redis.Redis, lock: FairLock | AsyncFairLock, count: int) -> Callable[[], bool]:
    """Whether ``count`` callers are in ``lock``'s queue."""
    return lambda: r.zcard(lock.fair_keys.queue) == count


def kill_once_queued(url: str, watchdog_timeout: float, is_queued: Callable[[], bool]) -> None:
    """Start a process waiting for the fair lock "report" (prefix "fair"); kill it once queued.

    ``is_queued`` says when the process's entry is in the queue; the entry is
    left there, and lives on for about ``watchdog_timeout`` (the process's own).
    """
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
                from django_rlock.core import LockClient
                client = LockClient({url!r}, key_prefix="fair",
                                    watchdog_timeout={watchdog_timeout})
                client.fair_lock("report").acquire()
            """),
        ]
    )
    try:
        wait_until(is_queued, "the child is queued")
    finally:
        child.kill()
        child.wait(HANG)
