"""Many waiters of one client, each woken by the release of its own lock by another process.

The shape of a gunicorn threaded worker or a Celery thread pool: every thread
(or asyncio task) of a process waits through the same client, hence the same
release listener, while a process that holds all their locks releases them
together. Each round returns, per waiter, the seconds from its lock's release
(the holder's clock, just before its release call) to its grant. A waiter
whose wake-up is lost is granted only when its sleep (the holder's PTTL, up to
the watchdog timeout) ends, so one such round takes that long.

Used by tests/sync/test_waiting_shared_listener.py and benchmarks/wakeups.py.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis

from django_rlock.core import LockClient
from django_rlock.core.aio import AsyncLockClient
from tests.children import python_module, read_answer

#: Seconds the waiters may take to register in their locks' waiting sets.
REGISTER = 30.0


@contextmanager
def holder(url: str, watchdog_timeout: float) -> Iterator[subprocess.Popen[str]]:
    """A process that holds locks and releases them together (tests/sync/many_holder.py)."""
    with python_module("tests.sync.many_holder", url, str(watchdog_timeout), stdin=True) as child:
        yield child


def tell(process: subprocess.Popen[str], line: str) -> dict[str, Any]:
    """Send ``line`` to the holder and return its answer."""
    assert process.stdin is not None
    process.stdin.write(line + "\n")
    process.stdin.flush()
    return read_answer(process)


def hold(process: subprocess.Popen[str], names: list[str]) -> None:
    """Have the holder take every lock of ``names``."""
    assert tell(process, "hold " + " ".join(names)) == {"held": len(names)}


def wait_registered(r: redis.Redis, names: list[str]) -> None:
    """Return once every lock of ``names`` has a registered waiter, i.e. one about to sleep."""
    deadline = time.monotonic() + REGISTER
    for name in names:
        while not r.zcard(f"test:{{{name}}}:waiters"):
            assert time.monotonic() < deadline, f"no waiter registered on {name}"
            time.sleep(0.005)


def release_all(process: subprocess.Popen[str]) -> list[float]:
    """Have the holder release every lock it holds; the moment each release was sent."""
    released_at: list[float] = tell(process, "release")["released_at"]
    return released_at


def thread_round(
    client: LockClient,
    process: subprocess.Popen[str],
    r: redis.Redis,
    names: list[str],
    wait: float,
) -> list[float]:
    """One thread per name waits through ``client``; seconds from each release to its grant.

    A waiter not granted within ``wait`` seconds counts as infinitely late.
    """
    hold(process, names)
    granted_at = [float("inf")] * len(names)

    def waiter(index: int) -> None:
        lock = client.lock(names[index])
        if lock.acquire(timeout=wait):
            granted_at[index] = time.monotonic()
            lock.release()

    threads = [threading.Thread(target=waiter, args=(index,)) for index in range(len(names))]
    for thread in threads:
        thread.start()
    try:
        wait_registered(r, names)
        released_at = release_all(process)
    finally:
        for thread in threads:
            thread.join(wait + 10)
    assert not any(thread.is_alive() for thread in threads), "a waiter hangs"
    return [granted - released for granted, released in zip(granted_at, released_at, strict=True)]


async def task_round(
    client: AsyncLockClient,
    process: subprocess.Popen[str],
    r: redis.Redis,
    names: list[str],
    wait: float,
) -> list[float]:
    """One asyncio task per name waits through ``client``; as :func:`thread_round`."""
    # The holder and the plain client block: off the loop, whose reader task
    # must keep reading while they do.
    await asyncio.to_thread(hold, process, names)

    async def waiter(name: str) -> float:
        lock = client.lock(name)
        if not await lock.acquire(timeout=wait):
            return float("inf")
        granted = time.monotonic()
        await lock.release()
        return granted

    tasks = [asyncio.create_task(waiter(name)) for name in names]
    try:
        await asyncio.to_thread(wait_registered, r, names)
        released_at = await asyncio.to_thread(release_all, process)
        granted_at = await asyncio.wait_for(asyncio.gather(*tasks), wait + 10)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return [granted - released for granted, released in zip(granted_at, released_at, strict=True)]
