"""Hand-over to a starving waiter: a release grants the lock to it, and says so on its channel.

A plain lock's waiter that was woken and lost, or has waited past
``STARVING_AFTER``, asks to be handed the lock; the holder's release then
grants it in the release script, marked ``~handoff``, and the waiter holds
when the message arrives, with no acquire call. A grant its waiter did not
take is confirmed by its next attempt; one whose waiter leaves is given back;
nobody is handed the lock unless its wake channel has a subscriber.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import statistics
import threading
import time
from multiprocessing.synchronize import Event as EventType
from typing import cast

import redis

from django_rlock.core import LockClient, RLock
from django_rlock.core._protocol.lock import STARVING_AFTER, LockScripts
from django_rlock.core.aio import AsyncLockClient

#: Generous bounds for a loaded machine.
BOUND = 20.0


def _wait_for(condition: object, what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def test_a_starving_waiter_is_handed_the_lock_by_the_release(
    r: redis.Redis, redis_url: str
) -> None:
    with (
        LockClient(redis_url, key_prefix="test") as holder_client,
        LockClient(redis_url, key_prefix="test") as waiter_client,
    ):
        held = holder_client.lock("starving")
        # A short lease first: the waiter's sleep ends with it, and its next
        # attempt (past STARVING_AFTER) finds the lock held again: it starves.
        assert held.acquire(lease=0.5)
        holder_token = held.token
        assert holder_token is not None
        waiting = waiter_client.lock("starving")
        seen: dict[str, object] = {}
        done = threading.Event()

        def wait() -> None:
            if waiting.acquire(timeout=60):
                seen["handoff"] = r.hget("test:{starving}", "~handoff")
                seen["token"] = waiting.token
                waiting.release()
            done.set()

        thread = threading.Thread(target=wait)
        thread.start()
        _wait_for(lambda: r.zcard("test:{starving}:waiters") == 1, "the waiter registered")
        held.extend(60)  # held on: the waiter's next attempt starves
        _wait_for(lambda: _asked(r, "test:{starving}"), "the waiter asked to be handed the lock")
        waiter_id = r.zrange("test:{starving}:waiters", 0, 0)[0]
        held.release()
        assert done.wait(BOUND), "the starving waiter was not handed the lock"
        thread.join(BOUND)
    assert seen["handoff"] == waiter_id  # granted by the release, not by an acquire
    assert isinstance(seen["token"], int) and seen["token"] > holder_token
    assert not r.exists("test:{starving}")


def _asked(r: redis.Redis, key: str) -> bool:
    """Whether a waiter asked to be handed the lock ``key`` (a '~w:' field of its hash)."""
    fields = cast("list[bytes]", r.hkeys(key))
    return any(name.startswith(b"~w:") for name in fields)


def _hold(r: redis.Redis, owner: str, **fields: str) -> None:
    r.hset("test:{handed}", owner, 1)
    for name, value in fields.items():
        r.hset("test:{handed}", name, value)
    r.hset("test:{handed}", "~t", 7)  # the grant's token, in its hash
    r.pexpire("test:{handed}", 30_000)


def test_a_grant_its_waiter_did_not_take_is_confirmed_by_its_next_attempt(
    r: redis.Redis, lock_client: LockClient
) -> None:
    _hold(r, "owner-1", **{"~handoff": "@w:1"})
    scripts = lock_client.scripts[LockScripts]
    keys = ["test:{handed}", "test:{handed}:waiters", "test:{handed}:req"]
    reply = scripts.acquire(keys=keys, args=["owner-1", 30_000, "@w:1", 1000, "9", 0, "0", ""])
    assert reply == [7, 1, 30_000]  # a new grant: one hold, not a re-entry's second
    assert not r.hexists("test:{handed}", "~handoff")


def test_a_waiter_that_leaves_gives_a_grant_handed_to_it_back(
    r: redis.Redis, lock_client: LockClient
) -> None:
    _hold(r, "owner-1", **{"~handoff": "@w:1"})
    scripts = lock_client.scripts[LockScripts]
    keys = ["test:{handed}", "test:{handed}:released", "test:{handed}:waiters"]
    scripts.abandon(keys=keys, args=["@w:1", "publish"])
    assert not r.exists("test:{handed}")


def test_no_lock_is_handed_to_a_waiter_whose_channel_nobody_listens_on(
    r: redis.Redis, lock_client: LockClient
) -> None:
    # A starving waiter of a process that is gone: its entry and its request
    # are there, its subscription is not.
    _hold(r, "owner-1", **{"~w:@gone:1": "owner-2\n30000\n0\n"})
    r.zadd("test:{handed}:waiters", {"@gone:1": time.time() * 1000 + 60_000})
    scripts = lock_client.scripts[LockScripts]
    keys = ["test:{handed}", "test:{handed}:released", "test:{handed}:waiters"]
    assert scripts.release(keys=keys, args=["owner-1", "publish", "1"]) == 0
    assert not r.exists("test:{handed}")  # free, not handed to owner-2
    assert r.zcard("test:{handed}:waiters") == 0


def test_a_pattern_subscriber_does_not_count_as_the_waiter(
    r: redis.Redis, lock_client: LockClient
) -> None:
    """A starving waiter whose process is gone, beside a PSUBSCRIBE that matches its channel.

    The publish's own count includes the pattern subscriber (a monitoring
    tool's ``PSUBSCRIBE *``); the grant must not stand on it, nor may a message
    naming a token go out for a grant that does not stand.
    """
    _hold(r, "owner-1", **{"~w:@gone:1": "owner-2\n30000\n0\n"})
    r.zadd("test:{handed}:waiters", {"@gone:1": time.time() * 1000 + 60_000})
    watcher = r.pubsub()
    try:
        watcher.psubscribe("test:{handed}:released*")
        assert watcher.get_message(timeout=BOUND) is not None  # the confirmation
        scripts = lock_client.scripts[LockScripts]
        keys = ["test:{handed}", "test:{handed}:released", "test:{handed}:waiters"]
        assert scripts.release(keys=keys, args=["owner-1", "publish", "1"]) == 0
        message = watcher.get_message(timeout=BOUND)
    finally:
        watcher.close()
    assert not r.exists("test:{handed}")  # free, not handed to owner-2
    assert message is not None
    assert message["data"] == b"@gone:1"  # woken, told of no grant


def test_a_wake_only_waiter_writes_no_request_into_the_holders_hash(
    r: redis.Redis, lock_client: LockClient
) -> None:
    """A cluster's waiters ('&') are never handed a lock: their attempts ask for none."""
    scripts = lock_client.scripts[LockScripts]
    keys = ["test:{handed}", "test:{handed}:waiters", "test:{handed}:req"]
    _hold(r, "owner-1")
    for waiter_id, rid in (("&w:1", "8"), ("@w:2", "9")):
        wait = scripts.acquire(
            keys=keys, args=["owner-2", 30_000, waiter_id, -1000, rid, 0, "0", ""]
        )
        assert isinstance(wait, int) and wait > 0  # busy: registered, not granted
    assert r.zcard("test:{handed}:waiters") == 2
    fields = cast("list[bytes]", r.hkeys("test:{handed}"))
    asked = {name for name in fields if name.startswith(b"~w:")}
    assert asked == {b"~w:@w:2"}  # the '@' waiter's request only


def test_a_waiter_that_leaves_takes_its_request_out_of_the_holders_hash(
    r: redis.Redis, lock_client: LockClient
) -> None:
    _hold(r, "owner-1", **{"~w:@w:2": "owner-2\n30000\n"})
    scripts = lock_client.scripts[LockScripts]
    keys = ["test:{handed}", "test:{handed}:released", "test:{handed}:waiters"]
    scripts.abandon(keys=keys, args=["@w:2", "publish"])
    assert sorted(r.hkeys("test:{handed}")) == [b"owner-1", b"~t"]  # the hold is untouched


def test_a_waiter_that_waited_past_starving_after_is_handed_the_lock(
    r: redis.Redis, redis_url: str
) -> None:
    with (
        LockClient(redis_url, key_prefix="test") as holder_client,
        LockClient(redis_url, key_prefix="test") as waiter_client,
    ):
        held = holder_client.lock("waited")
        assert held.acquire()
        waiting = waiter_client.lock("waited")
        seen: dict[str, object] = {}
        done = threading.Event()

        def wait() -> None:
            if waiting.acquire(timeout=60):
                seen["handoff"] = r.hget("test:{waited}", "~handoff")
                waiting.release()
            done.set()

        thread = threading.Thread(target=wait)
        thread.start()
        _wait_for(lambda: _asked(r, "test:{waited}"), "the waiter registered")
        waiter_id = r.zrange("test:{waited}:waiters", 0, 0)[0]
        time.sleep(STARVING_AFTER * 4)  # its one registration is now that old
        held.release()
        assert done.wait(BOUND), "the waiter was not woken"
        thread.join(BOUND)
    assert seen["handoff"] == waiter_id


def test_an_asyncio_waiter_that_waited_past_starving_after_is_handed_the_lock(
    r: redis.Redis, redis_url: str
) -> None:
    async def main(held: RLock) -> object:
        async with AsyncLockClient(redis_url, key_prefix="test") as client:
            waiting = client.lock("waited-aio")

            async def wait() -> tuple[object, int | None]:
                assert await waiting.acquire(timeout=60)
                handoff = r.hget("test:{waited-aio}", "~handoff")
                token = waiting.token
                await waiting.release()
                return handoff, token

            task = asyncio.ensure_future(wait())
            deadline = time.monotonic() + BOUND
            while not _asked(r, "test:{waited-aio}"):
                assert time.monotonic() < deadline, "the waiter registered"
                await asyncio.sleep(0.005)
            waiter_id = r.zrange("test:{waited-aio}:waiters", 0, 0)[0]
            await asyncio.sleep(STARVING_AFTER * 4)
            held.release()  # a blocking call, brief
            handoff, token = await asyncio.wait_for(task, BOUND)
            assert handoff == waiter_id
            return token

    with LockClient(redis_url, key_prefix="test") as holder_client:
        held = holder_client.lock("waited-aio")
        assert held.acquire()
        holder_token = held.token
        assert holder_token is not None
        token = asyncio.run(main(held))
    assert isinstance(token, int) and token > holder_token


def _barge(url: str, stop: EventType, stop_at: float) -> None:
    """Take and release ``barged`` back to back, counting each hold, until ``stop``."""
    raw = redis.Redis.from_url(url)
    with LockClient(url, key_prefix="test") as client:
        lock = client.lock("barged")
        while not stop.is_set() and time.monotonic() < stop_at:
            with lock:
                raw.incr("barge:cycles")
    raw.close()


def test_a_waiter_behind_a_holder_that_retakes_at_once_is_not_starved(
    r: redis.Redis, redis_url: str
) -> None:
    # The holder re-takes the lock the moment it releases it, as a loop does:
    # a woken waiter always loses that race. It starves, so a release hands
    # it the lock: each of its waits ends within a few of the holder's cycles.
    context = multiprocessing.get_context("fork")
    stop = context.Event()
    barger = context.Process(target=_barge, args=(redis_url, stop, time.monotonic() + 120))
    barger.start()
    try:
        _wait_for(lambda: int(r.get("barge:cycles") or 0) > 100, "the holder cycles")
        waited_cycles = []
        with LockClient(redis_url, key_prefix="test") as client:
            lock = client.lock("barged")
            for _ in range(20):
                before = int(r.get("barge:cycles") or 0)
                assert lock.acquire(timeout=BOUND)
                waited_cycles.append(int(r.get("barge:cycles") or 0) - before)
                lock.release()
                time.sleep(0.01)
        print(f"FIGURES fairness: the holder's cycles during each wait {sorted(waited_cycles)}")
        # Generous: a loaded machine delays the waiter's own first calls.
        assert statistics.median(waited_cycles) <= 50
    finally:
        stop.set()
        barger.join(BOUND)
    assert barger.exitcode == 0
