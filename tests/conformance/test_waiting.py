"""Waiting and loss, once for every engine: wake-ups, the watchdog's word, cancellation."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from django_rlock.core import LockLostError
from tests.conformance.conftest import engines
from tests.conformance.drivers import HANG, Driver, Engine

Connect = Callable[..., Driver]

LONG_LEASE = 30.0  # a waiter that polled on the lease would wait this long


def eventually(check: Callable[[], Any], what: str, bound: float = HANG) -> None:
    """Wait (bounded) until ``check()`` is true; fail naming ``what`` otherwise."""
    deadline = time.monotonic() + bound
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {bound}s: {what}")
        time.sleep(0.02)


# Every engine: `with` is all this rule uses.
@pytest.mark.parametrize("engine", engines(full_api=False))
def test_waiter_wakes_on_release_not_on_the_lease(connect: Connect, engine: Engine) -> None:
    driver = connect(engine)
    a, b = driver.owners(2)
    held = driver.lock("wake", lease=LONG_LEASE)
    a.call(held, "enter")
    waiter = b.start(driver.lock("wake", timeout=HANG), "enter")
    time.sleep(0.3)  # the waiter is waiting
    assert not waiter.done()
    a.call(held, "exit")
    released = time.monotonic()
    waiter.result(HANG)
    # Woken by the release message (pub/sub or a condition), far inside the lease.
    assert time.monotonic() - released < 3.0


# Every engine: `with` is all this rule uses.
@pytest.mark.parametrize("engine", engines(full_api=False))
def test_a_waiter_on_a_lease_longer_than_the_watchdog_timeout_still_wakes_on_release(
    connect: Connect, engine: Engine
) -> None:
    # A waiter's entry in the waiting set lives as long as the sleep it
    # announced (at most the watchdog timeout) + 0.5 s. It once slept on to the
    # holder's PTTL instead, outliving its entry: a release found no waiter to
    # name, and the waiter slept to its own timeout with the lock free.
    driver = connect(engine, watchdog_timeout=1.0)
    a, b = driver.owners(2)
    held = driver.lock("long-lease", lease=LONG_LEASE)
    a.call(held, "enter")
    waiter = b.start(driver.lock("long-lease", timeout=HANG), "enter")
    time.sleep(2.5)  # past the first entry's life (1.0 + 0.5 s)
    assert not waiter.done()
    a.call(held, "exit")
    released = time.monotonic()
    waiter.result(HANG)
    assert time.monotonic() - released < 3.0


def _loss_cases() -> list[Any]:
    """(engine, how): every engine loses its lock to a force-release by another owner;
    only engines with a server the test reaches can have the key deleted under them."""
    cases = []
    for param in engines():
        engine: Engine = param.values[0]
        cases.append(pytest.param(engine, "force_release", id=f"{engine.id}-force_release"))
        if engine.server:
            cases.append(pytest.param(engine, "delete_key", id=f"{engine.id}-delete_key"))
    return cases


@pytest.mark.parametrize(("engine", "how"), _loss_cases())
def test_watchdog_tells_the_holder_its_lock_was_lost(
    connect: Connect, engine: Engine, how: str
) -> None:
    driver = connect(engine)
    a, b = driver.owners(2)
    lock = driver.lock("lost")
    told = threading.Event()
    a.call(lock, "on_lost", lambda _lock: told.set())
    assert a.call(lock, "acquire") is True  # watchdog-renewed
    time.sleep(driver.watchdog_timeout / 2)  # at least one renewal went through
    assert a.call(lock, "lost") is False
    if how == "force_release":
        assert b.call(lock, "force_release") is True
    else:
        assert driver.admin is not None
        assert driver.admin.delete(driver.keys(lock).hash) == 1
    eventually(lambda: a.call(lock, "lost"), "lock.lost turns true")
    assert told.wait(HANG), "on_lost callback was not called"
    with pytest.raises(LockLostError):
        a.call(lock, "release")
    assert a.call(lock, "lost") is True  # until this owner acquires again
    assert a.call(lock, "owned") is False
    assert a.call(lock, "acquire") is True
    assert a.call(lock, "lost") is False
    a.call(lock, "release")


# Asyncio owners only: a thread cannot be cancelled.
@pytest.mark.parametrize("engine", engines(is_async=True, full_api=False))
def test_cancelled_waiter_leaves_nothing_held_or_subscribed(
    connect: Connect, engine: Engine
) -> None:
    driver = connect(engine)
    a, waiting, c = driver.owners(3)
    held = driver.lock("cancel", lease=LONG_LEASE)
    a.call(held, "enter")
    lock = driver.lock("cancel", timeout=HANG)
    waiter = waiting.start(lock, "enter")
    time.sleep(0.3)  # subscribed and in the waiting set
    waiter.cancel()
    with pytest.raises(concurrent.futures.CancelledError):
        waiter.result(HANG)
    if driver.admin is not None:
        admin, keys = driver.admin, driver.keys(lock)

        def left_nothing() -> bool:
            subscribed = dict(admin.pubsub_numsub(keys.channel))
            return subscribed.get(keys.channel.encode(), 0) == 0 and admin.zcard(keys.waiters) == 0

        eventually(left_nothing, "the cancelled waiter unsubscribed and left the waiting set", 3.0)
    a.call(held, "exit")
    # The next owner gets it at once: the cancelled waiter holds nothing.
    following = driver.lock("cancel", timeout=2.0)
    c.call(following, "enter")
    c.call(following, "exit")
    if driver.admin is not None:
        assert driver.admin.exists(driver.keys(lock).hash) == 0


# Every engine: `with` is all this rule uses.
@pytest.mark.parametrize("engine", engines(full_api=False))
def test_waiters_take_turns_one_at_a_time(connect: Connect, engine: Engine) -> None:
    driver = connect(engine)
    owners = driver.owners(4)
    locks = [driver.lock("turns", timeout=HANG) for _ in owners]
    pending = {
        index: owner.start(lock, "enter")
        for index, (owner, lock) in enumerate(zip(owners, locks, strict=True))
    }
    for _ in owners:
        eventually(lambda: any(p.done() for p in pending.values()), "one waiter gets the lock")
        time.sleep(0.15)  # nobody else may get it meanwhile
        done = [index for index, p in pending.items() if p.done()]
        assert len(done) == 1, f"holders at once: {done}"
        (index,) = done
        pending.pop(index).result()
        owners[index].call(locks[index], "exit")


@pytest.mark.parametrize("engine", engines())
def test_force_release_wakes_a_waiter(connect: Connect, engine: Engine) -> None:
    driver = connect(engine)
    a, b, c = driver.owners(3)
    lock = driver.lock("fwake")
    assert a.call(lock, "acquire", lease=LONG_LEASE) is True
    waiter = b.start(lock, "acquire", timeout=HANG)
    time.sleep(0.3)
    assert c.call(lock, "force_release") is True
    freed = time.monotonic()
    assert waiter.result(HANG) is True
    assert time.monotonic() - freed < 3.0
    assert b.call(lock, "owned") is True
