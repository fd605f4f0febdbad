"""The hold registry's events: what a subscriber is told when a hold is acquired, released, lost.

Each runs against a real server through a real client: the events come from
the registry the client's locks record their holds in.
"""

from __future__ import annotations

import asyncio
import queue
import threading

import pytest
import redis

from django_rlock.core import LockClient, LockLostError
from django_rlock.core.aio import AsyncLockClient
from django_rlock.core.hold import Hold
from django_rlock.core.identity import thread_owner

HANG = 10.0  # seconds: only ever reached when something hangs


def test_a_new_hold_is_told_once_and_its_last_release_once(lock_client: LockClient) -> None:
    acquired: list[Hold] = []
    released: list[Hold] = []
    lock_client.holds.on_acquired(acquired.append)
    lock_client.holds.on_released(released.append)
    lock = lock_client.lock("events")
    assert lock.acquire()
    assert lock.acquire()  # a re-entry is not a new hold
    assert [(hold.name, hold.token, hold.count) for hold in acquired] == [("events", lock.token, 2)]
    lock.release()
    assert released == []  # one hold is still held
    lock.release()
    assert released == acquired
    assert released[0].released and released[0].count == 0
    assert lock_client.holds.holds_of(lock.keys.hash, thread_owner()) == []


def test_a_lost_hold_is_told_with_the_hold(lock_client: LockClient, r: redis.Redis) -> None:
    lost: queue.Queue[Hold] = queue.Queue()
    lock_client.holds.on_lost(lost.put)
    told_by_client = threading.Event()
    lock_client.on_lost(lambda _lock: told_by_client.set())
    lock = lock_client.lock("taken-away")
    assert lock.acquire()
    token = lock.token
    assert lock.force_release()
    with pytest.raises(LockLostError):
        lock.release()
    hold = lost.get(timeout=HANG)
    assert (hold.name, hold.token, hold.lost) == ("taken-away", token, True)
    assert told_by_client.wait(HANG)  # LockClient.on_lost is a subscriber too
    assert lock_client.holds.holds_of(lock.keys.hash, thread_owner()) == []


def test_a_failing_subscriber_breaks_neither_the_lock_nor_the_others(
    lock_client: LockClient, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(_hold: Hold) -> None:
        raise RuntimeError("a subscriber's bug")

    told: list[str] = []
    lock_client.holds.on_acquired(broken)
    lock_client.holds.on_acquired(lambda hold: told.append(f"acquired {hold.name}"))
    lock_client.holds.on_released(broken)
    lock_client.holds.on_released(lambda hold: told.append(f"released {hold.name}"))
    with lock_client.lock("sturdy") as lock:
        assert lock.owned()
    assert not lock.locked()
    assert told == ["acquired sturdy", "released sturdy"]
    failures = [record for record in caplog.records if "hold event callback" in record.message]
    assert len(failures) == 2 and all(record.exc_info for record in failures)


def test_asyncio_holds_are_told_by_the_engines_registry(redis_url: str, r: redis.Redis) -> None:
    async def scenario() -> list[str]:
        told: list[str] = []
        async with AsyncLockClient(redis_url, key_prefix="test") as client:
            client.engine.holds.on_acquired(lambda hold: told.append(f"acquired {hold.name}"))
            client.engine.holds.on_released(lambda hold: told.append(f"released {hold.name}"))
            async with client.lock("async-events"), client.lock("async-events"):
                pass
        return told

    assert asyncio.run(scenario()) == ["acquired async-events", "released async-events"]
