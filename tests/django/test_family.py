"""Fair locks and read-write locks through ``locks[alias]``: the engine's, alias-attached.

Each kind is checked on the Redis alias (``default``) and the LocMem alias
(``mem``, the embedded server's engine), sync and asyncio, and on a cache
alias (no asyncio engine: the thread-owned adapter); a backend without the
kind refuses it by name.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock import locks
from django_rlock.backends._family import (
    AliasFairLock,
    AliasReadLock,
    AliasReadWriteLock,
    AliasWriteLock,
    AsyncAliasFairLock,
    AsyncAliasReadLock,
    AsyncAliasReadWriteLock,
    AsyncAliasWriteLock,
    ThreadOwnedReadWriteLock,
)
from django_rlock.backends._threadowned import ThreadOwnedLock
from django_rlock.backends.base import BaseLockBackend, LockInfo
from django_rlock.backends.redis import RedisLockBackend
from django_rlock.core import LockTimeout
from django_rlock.core.exceptions import LockUpgradeError
from django_rlock.signals import lock_acquired, lock_released
from tests.django.conftest import HANG, HoldingThreads
from tests.django.test_backends import in_thread
from tests.django.test_metrics import PLAIN, Reading

ALIASES = ["default", "mem"]
WAITERS = 4


def wait_until(check: Callable[[], bool], what: str) -> None:
    """Poll ``check`` until it holds (the test's own bounded wait, never the lock's)."""
    deadline = time.monotonic() + HANG
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def queued(backend: RedisLockBackend, lock: AliasFairLock, count: int) -> Callable[[], bool]:
    """Whether ``count`` callers are in ``lock``'s arrival queue."""
    return lambda: backend.client.redis.zcard(lock.fair_keys.queue) == count


def redis_backend(using: str) -> RedisLockBackend:
    backend = locks[using]
    assert isinstance(backend, RedisLockBackend)
    return backend


@pytest.fixture
def long_watchdog(settings: SettingsWrapper, rlocks: dict[str, Any]) -> None:
    """A watchdog timeout longer than any waiter's own timeout.

    A waiter then announces a sleep as long as its own timeout, and the order
    tests give later arrivals shorter timeouts: a plain lock's release would
    wake the latest arrival first, a fair lock must still serve the earliest.
    """
    settings.RLOCKS = {
        alias: {**params, "WATCHDOG_TIMEOUT": 60} for alias, params in rlocks.items()
    }


@pytest.fixture
def holders() -> Iterator[HoldingThreads]:
    made = HoldingThreads()
    yield made
    made.close()


# -- fair locks -------------------------------------------------------------------------


@pytest.mark.usefixtures("long_watchdog")
@pytest.mark.parametrize("using", ALIASES)
def test_a_fair_lock_goes_to_threads_in_arrival_order(using: str) -> None:
    backend = redis_backend(using)
    lock = backend.fair_lock("orders")
    assert isinstance(lock, AliasFairLock) and lock.backend is backend
    assert lock.acquire(lease=60)
    history: list[int] = []

    def waiter(index: int) -> None:
        if lock.acquire(timeout=2 * HANG - index):  # later arrivals wait less
            history.append(index)
            lock.release()

    threads = []
    for index in range(WAITERS):
        thread = threading.Thread(target=waiter, args=(index,))
        thread.start()
        threads.append(thread)
        wait_until(queued(backend, lock, index + 1), f"{index + 1} are queued")
    lock.release()
    for thread in threads:
        thread.join(2 * HANG)
    assert history == list(range(WAITERS))


@pytest.mark.usefixtures("long_watchdog")
@pytest.mark.parametrize("using", ALIASES)
def test_an_async_fair_lock_goes_to_tasks_in_arrival_order(using: str) -> None:
    backend = redis_backend(using)

    async def scenario() -> list[int]:
        lock = backend.async_fair_lock("orders")
        assert isinstance(lock, AsyncAliasFairLock) and lock.backend is backend
        assert await lock.acquire(lease=60)
        history: list[int] = []

        async def waiter(index: int) -> None:
            if await lock.acquire(timeout=2 * HANG - index):
                history.append(index)
                await lock.release()

        tasks = []
        for index in range(WAITERS):
            tasks.append(asyncio.create_task(waiter(index)))
            async with asyncio.timeout(HANG):
                while backend.client.redis.zcard(lock.fair_keys.queue) != index + 1:
                    await asyncio.sleep(0.01)
        await lock.release()
        async with asyncio.timeout(2 * HANG):
            await asyncio.gather(*tasks)
        return history

    assert asyncio.run(scenario()) == list(range(WAITERS))


@pytest.mark.parametrize("using", ALIASES)
def test_async_with_on_a_fair_lock_takes_its_task_owned_twin(using: str) -> None:
    lock = locks[using].fair_lock("report", timeout=0, max_hold=30)

    async def scenario() -> None:
        async with lock as twin:
            assert isinstance(twin, AsyncAliasFairLock)
            assert (twin.timeout, twin.max_hold) == (0, 30)  # the sync lock's defaults
            assert await twin.owned()

            async def other_task() -> None:
                async with lock:
                    pass

            with pytest.raises(LockTimeout):
                await asyncio.create_task(other_task())

    asyncio.run(scenario())
    assert not lock.locked()


def test_a_fair_lock_and_a_plain_lock_of_one_name_are_two_locks() -> None:
    with locks["default"].fair_lock("same"):
        assert locks["default"].lock("same").acquire(blocking=False)
        locks["default"].lock("same").release()


# -- read-write locks ---------------------------------------------------------------------


@pytest.mark.parametrize("using", ALIASES)
def test_readers_share_and_a_writer_excludes(using: str, holders: HoldingThreads) -> None:
    backend = locks[using]
    rw = backend.read_write_lock("doc", max_hold=30)
    assert isinstance(rw, AliasReadWriteLock) and rw.name == "doc"
    assert isinstance(rw.read, AliasReadLock) and isinstance(rw.write, AliasWriteLock)
    assert rw.read.backend is rw.write.backend is backend
    assert rw.read.max_hold == rw.write.max_hold == 30

    holders.keep(lambda: backend.read_write_lock("doc").read, "a read")
    with rw.read:  # a second reader, at once
        assert rw.read.owned() and rw.read.locked()
        with pytest.raises(LockUpgradeError):  # at once: it would wait on itself
            rw.write.acquire(timeout=HANG)
    # The other thread still reads: no writer.
    assert not rw.write.acquire(blocking=False)
    holders.close()
    assert rw.write.acquire(timeout=HANG)
    try:
        with rw.read:  # the writer may read
            assert rw.read.hold_count() == 1
        assert in_thread(lambda: rw.read.acquire(blocking=False)) is False
        assert in_thread(lambda: rw.write.acquire(blocking=False)) is False
    finally:
        rw.write.release()
    assert not rw.read.locked() and not rw.write.locked()


@pytest.mark.parametrize("using", ALIASES)
def test_async_with_on_each_side_takes_its_task_owned_twin(using: str) -> None:
    rw = locks[using].read_write_lock("doc", timeout=HANG)

    async def scenario() -> tuple[int, list[str]]:
        inside = most = 0
        twins: list[object] = []

        async def read() -> None:
            nonlocal inside, most
            async with rw.read as twin:
                twins.append(twin)
                inside += 1
                most = max(most, inside)
                await asyncio.sleep(0.05)
                inside -= 1

        await asyncio.gather(*(read() for _ in range(3)))
        assert all(isinstance(twin, AsyncAliasReadLock) for twin in twins)

        order: list[str] = []

        async def write() -> None:
            async with rw.write as twin:
                assert isinstance(twin, AsyncAliasWriteLock)
                order.append("write")
                await asyncio.sleep(0.2)
                order.append("written")

        async def late_read() -> None:
            await asyncio.sleep(0.05)  # the writer holds by now
            async with rw.read:
                order.append("read")

        await asyncio.gather(write(), late_read())
        return most, order

    most, order = asyncio.run(scenario())
    assert most == 3
    assert order == ["write", "written", "read"]


@pytest.mark.parametrize("using", ALIASES)
def test_the_native_async_read_write_lock(using: str) -> None:
    async def scenario() -> None:
        rw = locks[using].async_read_write_lock("doc", timeout=0)
        assert isinstance(rw, AsyncAliasReadWriteLock)
        assert isinstance(rw.read, AsyncAliasReadLock)
        assert isinstance(rw.write, AsyncAliasWriteLock)
        async with rw.write:
            async with rw.read:  # the writer may read
                assert await rw.read.hold_count() == 1

            async def other_reader() -> None:
                async with rw.read:
                    pass

            with pytest.raises(LockTimeout):
                await asyncio.create_task(other_reader())

    asyncio.run(scenario())


# -- a backend with no asyncio engine: each side on the task's own thread -------------------


@pytest.fixture
def cached(settings: SettingsWrapper, rlocks: dict[str, Any], redis_url: str) -> None:
    settings.CACHES = {
        **settings.CACHES,
        "redis": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": redis_url},
    }
    settings.RLOCKS = {**rlocks, "cached": {"CACHE": "redis", "KEY_PREFIX": "t"}}


@pytest.mark.usefixtures("cached")
def test_a_cache_alias_runs_the_async_kinds_on_the_tasks_thread() -> None:
    backend = locks["cached"]

    async def scenario() -> list[str]:
        fair = backend.async_fair_lock("report", timeout=0)
        assert isinstance(fair, ThreadOwnedLock)
        assert isinstance(fair.lock, AliasFairLock)
        rw = backend.async_read_write_lock("doc", timeout=0)
        assert isinstance(rw, ThreadOwnedReadWriteLock) and rw.name == "doc"
        order: list[str] = []

        async def other(side: Any, what: str) -> None:
            try:
                async with side:
                    order.append(f"{what} taken")
            except LockTimeout:
                order.append(f"{what} busy")

        async with fair:
            await asyncio.create_task(other(backend.async_fair_lock("report", timeout=0), "fair"))
        async with rw.read:
            await asyncio.create_task(other(rw.read, "read"))  # readers share
            await asyncio.create_task(other(rw.write, "write"))
        async with rw.write, rw.read:  # one task, one owner: the writer may read
            await asyncio.create_task(other(rw.read, "read"))
        return order

    assert asyncio.run(scenario()) == ["fair busy", "read taken", "write busy", "read busy"]


# -- reporting -------------------------------------------------------------------------


KINDS: dict[str, Callable[[BaseLockBackend, str], Any]] = {
    "fair": lambda backend, name: backend.fair_lock(name),
    "read": lambda backend, name: backend.read_write_lock(name).read,
    "write": lambda backend, name: backend.read_write_lock(name).write,
}
ALIAS_CLASSES = {
    "fair": (AliasFairLock, AsyncAliasFairLock),
    "read": (AliasReadLock, AsyncAliasReadLock),
    "write": (AliasWriteLock, AsyncAliasWriteLock),
}


@pytest.fixture
def signals() -> Iterator[list[tuple[str, str, str, object]]]:
    """The lock signals sent while the test runs: (signal, name, alias, lock)."""
    sent: list[tuple[str, str, str, object]] = []

    def acquired(sender: object, **kwargs: Any) -> None:
        sent.append(("acquired", kwargs["name"], kwargs["alias"], kwargs["lock"]))

    def released(sender: object, **kwargs: Any) -> None:
        sent.append(("released", kwargs["name"], kwargs["alias"], kwargs["lock"]))

    lock_acquired.connect(acquired)
    lock_released.connect(released)
    yield sent
    lock_acquired.disconnect(acquired)
    lock_released.disconnect(released)


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("using", ALIASES)
def test_each_kind_sends_the_lock_signals_sync_and_async(
    kind: str, using: str, signals: list[tuple[str, str, str, object]]
) -> None:
    backend = locks[using]
    lock = KINDS[kind](backend, f"{kind}-signals")
    sync_class, async_class = ALIAS_CLASSES[kind]
    with lock, lock:  # a re-entry sends nothing
        pass

    async def scenario() -> None:
        async with lock:
            pass

    asyncio.run(scenario())
    assert [(what, name, alias) for what, name, alias, _ in signals] == [
        ("acquired", f"{kind}-signals", using),
        ("released", f"{kind}-signals", using),
    ] * 2
    assert all(isinstance(sent[3], sync_class) for sent in signals[:2])
    assert all(isinstance(sent[3], async_class) for sent in signals[2:])


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kind_records_its_hold_times(kind: str) -> None:
    backend = locks["default"]
    lock = KINDS[kind](backend, f"{kind}-times")
    for _ in range(3):  # the fewest holds that say how long the lock is held
        with lock:
            pass
    assert backend.hold_times.typical(f"{kind}-times", None) is not None


@pytest.mark.usefixtures("metrics_on")
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kind_is_counted_in_the_metrics(kind: str) -> None:
    reading = Reading("default", PLAIN)
    with KINDS[kind](locks["default"], f"{kind}-metrics"):
        assert reading.moved()["acquired"] == 1
    moved = reading.moved()
    assert (moved["acquired"], moved["hold"]) == (1, 1)


@pytest.fixture
def metrics_on(settings: SettingsWrapper) -> None:
    settings.RLOCK_METRICS = "prometheus"


# -- a backend without the kinds ----------------------------------------------------------


class BareBackend(BaseLockBackend):
    """A backend with locks only (a third party's, say): the kinds it lacks say so."""

    def lock(self, name: str, **options: Any) -> Any:
        raise AssertionError("not used here")

    def names(self, pattern: str = "*") -> Iterator[str]:
        return iter(())

    def inspect(self, name: str) -> LockInfo | None:
        return None


@pytest.mark.parametrize(
    ("factory", "kind"),
    [
        (lambda backend: backend.fair_lock("x"), "fair locks"),
        (lambda backend: backend.read_write_lock("x"), "read-write locks"),
        (lambda backend: backend.async_fair_lock("x"), "fair locks"),
        (lambda backend: backend.async_read_write_lock("x"), "read-write locks"),
    ],
)
def test_a_backend_without_the_kind_says_so(
    settings: SettingsWrapper,
    rlocks: dict[str, Any],
    factory: Callable[[BaseLockBackend], object],
    kind: str,
) -> None:
    settings.RLOCKS = {**rlocks, "bare": {"BACKEND": f"{__name__}.BareBackend"}}
    with pytest.raises(
        NotImplementedError, match=rf"BareBackend of RLOCKS\['bare'\] has no {kind}"
    ):
        factory(locks["bare"])
