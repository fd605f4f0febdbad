"""A release publishes only when someone waits, and still wakes a waiter at once.

PUBLISH calls are counted by the server itself (INFO commandstats counts the
commands run inside scripts too); the ``r`` fixture resets the counts.
"""

from __future__ import annotations

import threading
import time

import redis

from django_rlock.core import LockClient


def _publishes(r: redis.Redis) -> int:
    stats = r.info("commandstats")
    return sum(
        int(stats.get(name, {}).get("calls", 0)) for name in ("cmdstat_publish", "cmdstat_spublish")
    )


def test_a_release_nobody_waits_for_publishes_nothing(
    lock_client: LockClient, r: redis.Redis
) -> None:
    lock = lock_client.lock("alone")
    for _ in range(3):
        lock.acquire()
        lock.acquire()  # a re-entry: its release leaves the lock held
        lock.release()
        lock.release()
    assert not lock.locked()
    assert _publishes(r) == 0


def test_a_release_with_a_waiter_publishes_once_and_wakes_it(
    lock_client: LockClient, r: redis.Redis
) -> None:
    lock = lock_client.lock("awaited")
    lock.acquire()  # a watchdog hold: without a message the waiter would sleep ~30 s
    granted = threading.Event()

    def waiter() -> None:
        if lock.acquire(timeout=25):
            granted.set()
            lock.release()  # nobody waits any more: no second message

    thread = threading.Thread(target=waiter)
    thread.start()
    deadline = time.monotonic() + 10
    while r.zcard("test:{awaited}:waiters") < 1:
        assert time.monotonic() < deadline, "the waiter never registered"
        time.sleep(0.01)
    released_at = time.monotonic()
    lock.release()
    assert granted.wait(10), "the waiter was not woken by the release"
    woken_after = time.monotonic() - released_at
    thread.join(10)
    assert woken_after < 5  # by message, far inside the 30 s PTTL it would otherwise sleep
    assert _publishes(r) == 1
