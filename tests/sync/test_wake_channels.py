"""A release wakes one process: it is published on the woken waiter's wake channel.

Several clients (each its own release listener, as separate processes have)
wait on one lock. Each release must reach the one listener whose waiter it
names, not every listener of the lock; and the shared channel, which every
waiter also listens on for older versions' releases, gets nothing from ours
(a raw subscriber counts what is published there). Waiters registered by an
older version (an id with no wake name) are still told on the shared channel,
and a release of an older version (a message naming a new waiter on the
shared channel) still wakes it: tests/sync/test_rolling_upgrade.py runs the
previous release itself.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack, ExitStack, contextmanager
from typing import cast

import redis

from django_rlock.core import LockClient, RLock
from django_rlock.core.aio import AsyncLockClient

#: Generous bounds for a loaded machine; the waiters' sleep (the holder's PTTL,
#: the 30 s watchdog timeout) is far longer, so a lost wake-up fails them.
REGISTER = 20.0
WOKEN = 10.0


def _wait_for(condition: object, what: str, bound: float = REGISTER) -> None:
    deadline = time.monotonic() + bound
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


@contextmanager
def _shared_channel_messages(r: redis.Redis, channel: str) -> Iterator[list[bytes]]:
    """Every message published on ``channel`` during the block (read after it)."""
    pubsub = r.pubsub()
    pubsub.subscribe(channel)
    assert pubsub.get_message(timeout=5) is not None  # the subscription's confirmation
    seen: list[bytes] = []
    try:
        yield seen
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            message = pubsub.get_message(timeout=0.1)
            if message is not None and message["type"] == "message":
                seen.append(message["data"])
    finally:
        pubsub.close()


def test_each_release_reaches_only_the_listener_of_the_waiter_it_wakes(
    r: redis.Redis, redis_url: str
) -> None:
    listeners = 3
    with ExitStack() as stack:
        holder = stack.enter_context(LockClient(redis_url, key_prefix="test"))
        clients = [
            stack.enter_context(LockClient(redis_url, key_prefix="test")) for _ in range(listeners)
        ]
        shared = stack.enter_context(_shared_channel_messages(r, "test:{one-wake}:released"))
        lock = holder.lock("one-wake")
        lock.acquire()  # a watchdog hold: a lost wake-up costs a waiter ~30 s
        granted: list[float] = []
        done = threading.Barrier(listeners + 1)

        def wait(client: LockClient) -> None:
            mine = client.lock("one-wake")
            if mine.acquire(timeout=60):
                granted.append(time.monotonic())
                mine.release()  # wakes the next waiter, on its own channel
            done.wait(60)

        threads = [threading.Thread(target=wait, args=(client,)) for client in clients]
        for thread in threads:
            thread.start()
        _wait_for(lambda: r.zcard("test:{one-wake}:waiters") == listeners, "waiters registered")
        released_at = time.monotonic()
        lock.release()
        done.wait(60)
        for thread in threads:
            thread.join(10)
    assert len(granted) == listeners
    assert max(granted) - released_at < WOKEN, "a waiter slept out the holder's PTTL"
    # One message per release that had a waiter (3), each read by one listener
    # alone; the shared channel heard none of them.
    assert shared == []
    assert sum(client.listener.messages for client in clients) == listeners


def test_an_older_versions_waiter_is_woken_on_the_shared_channel(
    r: redis.Redis, lock_client: LockClient
) -> None:
    lock = lock_client.lock("old-waiter")
    lock.acquire()
    # An older version's waiter id: a hex listener id, no wake name.
    r.zadd("test:{old-waiter}:waiters", {"0123456789abcdef:7": time.time() * 1000 + 60_000})
    with _shared_channel_messages(r, "test:{old-waiter}:released") as shared:
        lock.release()
    assert shared == [b"0123456789abcdef:7"]


def test_a_release_naming_a_new_waiter_on_the_shared_channel_wakes_it(
    r: redis.Redis, redis_url: str, lock_client: LockClient
) -> None:
    # What an older version's release does: publish the first waiter's id on
    # the shared channel. The holder here never releases (nothing of ours
    # publishes): only that message can wake the waiter before the 30 s PTTL.
    r.hset("test:{old-release}", "someone-else", 1)
    r.pexpire("test:{old-release}", 30_000)
    lock = lock_client.lock("old-release")
    granted = threading.Event()

    def wait() -> None:
        if lock.acquire(timeout=60):
            granted.set()
            lock.release()

    thread = threading.Thread(target=wait)
    thread.start()
    _wait_for(lambda: r.zcard("test:{old-release}:waiters") == 1, "the waiter registered")
    waiter_id = cast("list[bytes]", r.zrange("test:{old-release}:waiters", 0, 0))[0]
    assert waiter_id.startswith(b"@")  # a wake name: ours publish on its wake channel
    r.delete("test:{old-release}")
    r.publish("test:{old-release}:released", waiter_id)
    assert granted.wait(WOKEN), "a release on the shared channel did not wake the waiter"
    thread.join(10)


def test_each_release_reaches_only_the_asyncio_listener_of_the_waiter_it_wakes(
    r: redis.Redis, redis_url: str
) -> None:
    listeners = 3

    async def main(lock: RLock) -> list[float]:
        granted: list[float] = []
        async with AsyncExitStack() as stack:
            clients = [
                await stack.enter_async_context(AsyncLockClient(redis_url, key_prefix="test"))
                for _ in range(listeners)
            ]

            async def wait(client: AsyncLockClient) -> None:
                mine = client.lock("one-wake-aio")
                if await mine.acquire(timeout=60):
                    granted.append(time.monotonic())
                    await mine.release()  # wakes the next waiter, on its own channel

            tasks = [asyncio.ensure_future(wait(client)) for client in clients]
            deadline = time.monotonic() + REGISTER
            while r.zcard("test:{one-wake-aio}:waiters") < listeners:
                assert time.monotonic() < deadline, "waiters registered"
                await asyncio.sleep(0.005)
            released_at = time.monotonic()
            lock.release()  # a blocking call, brief: the waiters wait on the server
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
            assert len(granted) == listeners
            assert max(granted) - released_at < WOKEN, "a waiter slept out the holder's PTTL"
            assert sum(client.listener.messages for client in clients) == listeners
        return granted

    with (
        LockClient(redis_url, key_prefix="test") as holder,
        _shared_channel_messages(r, "test:{one-wake-aio}:released") as shared,
    ):
        lock = holder.lock("one-wake-aio")
        lock.acquire()
        asyncio.run(main(lock))
    assert shared == []
