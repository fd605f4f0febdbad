"""The semaphore contract (the public contract: docs/engine.md), for every engine.

The same rules for ``LockClient.semaphore``, ``AsyncLockClient.semaphore`` and
Django's ``semaphore()`` (sync and ``async with``) on the Redis, embedded and
LocMem backends: at most ``permits`` owners hold at once, a release wakes a
waiter, each owner's permits are its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from django_rlock import locks, semaphore
from django_rlock.core import LockNotOwnedError, LockTimeout
from tests.conformance.conftest import engines
from tests.conformance.drivers import HANG, AsyncHandle, Driver, Engine, LoopThread

Connect = Callable[..., Driver]

#: Far below the 30 s bound a waiter nobody woke would sleep (the holders'
#: watchdog timeout is longer than any wait here).
PROMPT = 5.0


def semaphores(driver: Driver) -> Callable[..., Any]:
    """``make(name, permits, **defaults)``: a semaphore of the driver's engine."""
    engine = driver.engine
    if not engine.django:
        client = driver.lock("-").client  # the engine's LockClient / AsyncLockClient

        def make_core(name: str, permits: int, **defaults: Any) -> Any:
            return client.semaphore(name, permits, **defaults)

        return make_core
    if not engine.is_async:

        def make_sync(name: str, permits: int, **defaults: Any) -> Any:
            return semaphore(name, permits, **defaults)

        return make_sync
    loop = _loop_of(driver)

    async def handle(name: str, permits: int, defaults: dict[str, Any]) -> AsyncHandle:
        entry = semaphore(name, permits, **defaults)
        twin = locks["default"].async_semaphore(name, permits, **defaults)
        return AsyncHandle(entry=entry, twin=twin, keys=entry.keys)

    def make_async(name: str, permits: int, **defaults: Any) -> Any:
        return loop.run(handle(name, permits, defaults))

    return make_async


def _loop_of(driver: Driver) -> LoopThread:
    # The Django asyncio driver's owners run on one loop thread: find it
    # through an owner, so the semaphores are made on the loop that uses them.
    owner: Any = driver.owner()
    loop: LoopThread = owner._loop
    return loop


@pytest.mark.parametrize("engine", engines())
def test_at_most_permits_owners_hold_at_once(connect: Connect, engine: Engine) -> None:
    driver = connect(engine, watchdog_timeout=30)
    make = semaphores(driver)
    a, b, c = driver.owners(3)
    pool = make("pool", 2, timeout=0.2)
    a.call(pool, "enter")
    b.call(pool, "enter")
    assert a.call(pool, "available") == 0
    with pytest.raises(LockTimeout):
        c.call(make("pool", 2, timeout=0.2), "enter")
    assert c.call(pool, "acquire", blocking=False) is False
    a.call(pool, "exit")
    assert c.call(pool, "acquire", blocking=False) is True
    assert c.call(pool, "hold_count") == 1 and a.call(pool, "hold_count") == 0
    with pytest.raises(LockNotOwnedError):
        a.call(pool, "release")  # a gave its permit back: it holds none
    b.call(pool, "exit")
    c.call(pool, "release")
    assert a.call(pool, "available") == 2


@pytest.mark.parametrize("engine", engines())
def test_a_release_wakes_a_waiter(connect: Connect, engine: Engine) -> None:
    driver = connect(engine, watchdog_timeout=30)
    make = semaphores(driver)
    a, b = driver.owners(2)
    pool = make("wake", 1)
    assert a.call(pool, "acquire") is True
    waiting = b.start(pool, "acquire", timeout=HANG)
    time.sleep(0.3)  # b registers and sleeps
    assert not waiting.done()
    released_at = time.monotonic()
    a.call(pool, "release")
    assert waiting.result() is True
    assert time.monotonic() - released_at < PROMPT
    assert b.call(pool, "owned") is True
    b.call(pool, "release")
