"""A busy lock's LockTimeout says who holds it and what its TTL means.

It used to say "the holder's lease ends in 29.9s" for every hold, also for one
its holder's watchdog renews for as long as it runs: the lock would not be
free then. A grant now records its lease beside its holder (host, pid,
thread), and the error reads that record: a lease ends; a watchdog hold is
renewed until it is released, and its TTL is only how soon it would free the
lock were its holder to die.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Iterator

import pytest
import redis

from django_rlock.core import LockClient, LockTimeout
from django_rlock.core.aio import AsyncLockClient

HANG = 20.0  # seconds: only reached when something hangs


@pytest.fixture
def hold(lock_client: LockClient) -> Iterator[object]:
    """``hold(name, lease)``: lock ``name`` on a thread called 'holder' until the test ends."""
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def start(name: str, lease: float | None) -> None:
        held = threading.Event()

        def run() -> None:
            lock = lock_client.lock(name)
            assert lock.acquire(lease=lease)
            held.set()
            stop.wait(HANG)
            lock.release()

        thread = threading.Thread(target=run, name="holder", daemon=True)
        thread.start()
        assert held.wait(HANG)
        threads.append(thread)

    yield start
    stop.set()
    for thread in threads:
        thread.join(HANG)


WHO = f"{socket.gethostname()} pid {os.getpid()} thread 'holder'"


def test_a_watchdog_hold_is_not_called_a_lease(lock_client: LockClient, hold: object) -> None:
    hold("busy:watchdog", None)  # type: ignore[operator]
    with pytest.raises(LockTimeout) as raised, lock_client.lock("busy:watchdog", timeout=0.05):
        pass
    message = str(raised.value)
    assert "lease ends" not in message
    assert f"held by {WHO}, whose watchdog renews it until it is released" in message
    assert "were that process to die, it would be free within" in message


def test_a_lease_hold_says_when_its_lease_ends(lock_client: LockClient, hold: object) -> None:
    hold("busy:lease", 30)  # type: ignore[operator]
    with pytest.raises(LockTimeout) as raised, lock_client.lock("busy:lease", timeout=0.05):
        pass
    assert f"held by {WHO}, whose 30s lease ends in " in str(raised.value)
    assert raised.value.retry_after is not None and 0 < raised.value.retry_after <= 30


def test_the_asyncio_engine_says_the_same(
    lock_client: LockClient, hold: object, redis_url: str
) -> None:
    hold("busy:aio", None)  # type: ignore[operator]

    async def busy() -> str:
        async with AsyncLockClient(redis_url, key_prefix="test") as client:
            with pytest.raises(LockTimeout) as raised:
                async with client.lock("busy:aio", timeout=0.05):
                    pass
            return str(raised.value)

    assert f"held by {WHO}, whose watchdog renews it" in asyncio.run(busy())


def test_a_key_written_by_another_program_is_described_as_no_more_than_it_is(
    lock_client: LockClient, r: redis.Redis
) -> None:
    key = lock_client.lock("busy:foreign").keys.hash
    r.hset(key, "someone:1", 1)  # no description: not a grant of this library
    r.pexpire(key, 30_000)
    with pytest.raises(LockTimeout) as raised, lock_client.lock("busy:foreign", timeout=0.05):
        pass
    assert "its key expires in " in str(raised.value)
    assert "unless its holder renews it" in str(raised.value)


def test_holder_says_who_holds_it_and_whether_a_lease_ends_it(
    lock_client: LockClient, hold: object
) -> None:
    hold("busy:who", None)  # type: ignore[operator]
    hold("busy:leased", 12.5)  # type: ignore[operator]
    watchdog = lock_client.lock("busy:who").holder()
    assert watchdog is not None
    assert (watchdog["host"], watchdog["pid"], watchdog["thread"]) == (
        socket.gethostname(),
        os.getpid(),
        "holder",
    )
    assert watchdog["lease"] is None and watchdog["acquired_at"]
    leased = lock_client.lock("busy:leased").holder()
    assert leased is not None and leased["lease"] == 12.5
    assert lock_client.lock("busy:free").holder() is None


@pytest.mark.pure
def test_the_reasons_read_from_a_description() -> None:
    from django_rlock.core._process.holder import (  # noqa: PLC0415
        busy_reason,
        describe,
        read_hold,
    )

    watchdog, leased = describe(), describe(2.5)
    assert "lease" not in watchdog and leased.endswith("2.5")  # the process part's last value
    assert read_hold(leased.encode(), b"1700000000000") == {
        **(read_hold(watchdog, None) or {}),
        "lease": 2.5,
        "acquired_at": "2023-11-14T22:13:20+00:00",
    }
    assert "whose 2.5s lease ends in 1.000s" in busy_reason(read_hold(leased, None), 1.0)
    assert "whose watchdog renews it" in busy_reason(read_hold(watchdog, None), 1.0)
    assert busy_reason(None, float("inf")).startswith("its key has no expiry")
    assert busy_reason(None, None) == "it was released meanwhile"
