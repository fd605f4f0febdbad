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
from django_rlock.core._process.identity import thread_owner
from django_rlock.core._protocol.holds import GaveUp, Hold
from django_rlock.core.aio import AsyncLockClient

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


def test_a_lost_hold_given_back_is_a_release_event_marked_lost(lock_client: LockClient) -> None:
    released: list[Hold] = []
    lock_client.holds.on_released(released.append)
    lock = lock_client.lock("lost-then-released")
    assert lock.acquire()
    assert lock.acquire()
    assert lock.force_release()
    with pytest.raises(LockLostError):
        lock.release()  # the release finds it lost: one of two holds given back
    assert released == []
    with pytest.raises(LockLostError):
        lock.release()
    assert [(hold.name, hold.lost) for hold in released] == [("lost-then-released", True)]


def test_a_grant_says_how_long_its_caller_waited(lock_client: LockClient) -> None:
    acquired: list[Hold] = []
    lock_client.holds.on_acquired(acquired.append)
    holder = lock_client.lock("waited-for")
    assert holder.acquire(lease=0.3)  # not released: the waiter gets it when the lease ends
    waiter = threading.Thread(target=lambda: lock_client.lock("waited-for").acquire(timeout=HANG))
    waiter.start()
    waiter.join(HANG)
    assert len(acquired) == 2
    # Relative, not timed: the uncontended grant waited less than the one that
    # waited out the 0.3 s lease.
    assert acquired[0].waited < acquired[1].waited
    assert 0.2 <= acquired[1].waited < HANG


def test_an_acquire_that_gets_nothing_is_told_on_both_engines(redis_url: str) -> None:
    gave_up: list[GaveUp] = []
    with LockClient(redis_url, key_prefix="gaveup") as client:
        client.holds.on_gave_up(gave_up.append)
        assert client.lock("busy").acquire(lease=5)

        def contend() -> None:
            assert client.lock("busy").acquire(timeout=0.2) is False
            assert client.lock("busy").acquire(blocking=False) is False

        thread = threading.Thread(target=contend)
        thread.start()
        thread.join(HANG)

        async def contend_async() -> None:
            async with AsyncLockClient(redis_url, key_prefix="gaveup") as aclient:
                aclient.engine.holds.on_gave_up(gave_up.append)
                assert await aclient.lock("busy").acquire(timeout=0.2) is False
                assert await aclient.lock("busy").acquire(timeout=0) is False

        asyncio.run(contend_async())
        client.lock("busy").release()
    assert [(event.name, event.owner != thread_owner()) for event in gave_up] == [
        ("busy", True)
    ] * 4
    timed_out, one_attempt, timed_out_async, zero_wait_async = (event.waited for event in gave_up)
    assert timed_out >= 0.2 and timed_out_async >= 0.2
    # A single attempt does not wait out a timeout (relative: no timed bound).
    assert one_attempt < timed_out and zero_wait_async < timed_out_async
    # A wait that ran out, or a single attempt (blocking=False, timeout=0): the metrics' outcomes.
    assert [event.would_wait for event in gave_up] == [True, False, True, False]
