"""Fault 6: the server ran acquire or release, but the reply was lost on the way back.

redis-py resends a command whose connection broke (by default from redis-py 6
on; the tests ask for it, so they show the same on redis-py 5).
Unprotected, a resent acquire counts a second hold and a resent release gives
back one hold too many. The request latch (see django_rlock.core._protocol.lock)
makes the resend report the first call's outcome instead: hold counts stay
exact. The control test shows the fault is real: the bare script double-counts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
import redis
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.retry import Retry

from django_rlock.core import LockClient, LockUnavailableError
from django_rlock.core._process.identity import task_owner, thread_owner
from django_rlock.core._protocol.lock import ACQUIRE
from django_rlock.core.aio import AsyncLockClient
from tests.faults.proxy import FaultProxy
from tests.lockhash import owner_counts
from tests.servers import RedisServer

pytestmark = pytest.mark.faults


def retrying_client(port: int) -> redis.Redis:
    """A client that resends a command whose connection broke, as redis-py >= 6 does by default."""
    return redis.Redis(
        host="127.0.0.1",
        port=port,
        retry=Retry(NoBackoff(), 3),
        retry_on_error=[redis.ConnectionError],
    )


@pytest.mark.parametrize("resender", ["redis-py retries", "the engine resends"])
def test_resent_acquire_and_release_apply_once(
    private_server: RedisServer, proxy: FaultProxy, resender: str
) -> None:
    direct = private_server.client()
    # A client built by the caller keeps its retries; a URL-built one has none,
    # and the engine itself resends once on a broken connection.
    caller: str | redis.Redis = (
        retrying_client(proxy.port) if resender == "redis-py retries" else proxy.url
    )
    with LockClient(caller, key_prefix="f") as client:
        lock = client.lock("reply")
        lock.acquire()  # loads the scripts: from now on each call is one EVALSHA
        warm_up_token = lock.token
        lock.release()
        key, owner = lock.keys.hash, thread_owner()

        steps: list[tuple[Callable[[], object], int]] = [
            (lock.acquire, 1),  # a new grant
            (lock.acquire, 2),  # a re-entry
            (lock.acquire, 3),
            (lock.release, 2),  # a partial release
            (lock.release, 1),
        ]
        tokens: set[int | None] = set()
        for number, (call, holds) in enumerate(steps, start=1):
            proxy.drop_reply_after(b"EVALSHA")
            call()
            assert proxy.dropped_replies == number
            assert int(direct.hget(key, owner) or 0) == holds
            assert lock.hold_count() == holds
            tokens.add(lock.token)
        (token,) = tokens  # one new grant since the warm-up, kept by every re-entry
        assert token is not None and warm_up_token is not None and token > warm_up_token

        proxy.drop_reply_after(b"EVALSHA")
        lock.release()  # the final release, resent: no LockLostError, nothing more freed
        assert proxy.dropped_replies == len(steps) + 1
        assert not direct.exists(key) and not lock.lost
        # The release left its id and the released token in the name's latches.
        assert direct.hget(lock.keys.latches, "~t") == str(token).encode()
        assert lock.acquire(blocking=False) and lock.token is not None and lock.token > token
        lock.release()
    direct.close()
    if isinstance(caller, redis.Redis):
        caller.close()


def test_asyncio_calls_whose_replies_are_lost_apply_once(
    private_server: RedisServer, proxy: FaultProxy
) -> None:
    """The asyncio twin: each call's connection is cut after Redis ran it, before its reply.

    The client's lean connection sends the call once more, on a new connection,
    with its request id: the latch reports what the first one did.
    """
    direct = private_server.client()

    async def scenario() -> None:
        async with AsyncLockClient(proxy.url, key_prefix="f") as client:
            lock = client.lock("reply")
            await lock.acquire()  # loads the scripts: from now on each call is one EVALSHA
            warm_up_token = lock.token
            await lock.release()
            key, owner = lock.keys.hash, task_owner()
            steps: list[tuple[Callable[[], Awaitable[object]], int]] = [
                (lock.acquire, 1),  # a new grant
                (lock.acquire, 2),  # a re-entry
                (lock.release, 1),  # a partial release
            ]
            tokens: set[int | None] = set()
            for number, (call, holds) in enumerate(steps, start=1):
                proxy.drop_reply_after(b"EVALSHA")
                await call()
                assert proxy.dropped_replies == number
                assert int(direct.hget(key, owner) or 0) == holds
                assert await lock.hold_count() == holds
                tokens.add(lock.token)
            (token,) = tokens  # one new grant since the warm-up, kept by the re-entry
            assert token is not None and warm_up_token is not None and token > warm_up_token
            proxy.drop_reply_after(b"EVALSHA")
            await lock.release()  # the final release, resent: no LockLostError
            assert not direct.exists(key) and not lock.lost
            assert await lock.acquire(blocking=False) and lock.token is not None
            assert lock.token > token
            await lock.release()

    asyncio.run(scenario())
    direct.close()


def test_without_the_latch_a_lost_reply_double_counts(
    private_server: RedisServer, proxy: FaultProxy
) -> None:
    """The control: the same fault against the script called without its latch."""
    client = retrying_client(proxy.port)
    bare = Script(client, ACQUIRE)
    keys = ["f:{bare}", "f:{bare}:waiters", "f:{bare}:req"]
    args: list[str | int] = ["owner", 30000, "", 0, "", 0, "0", ""]  # ARGV[5] '': no request id
    bare(keys=keys, args=args)
    client.delete(*keys)
    proxy.drop_reply_after(b"EVALSHA")
    bare(keys=keys, args=args)
    assert proxy.dropped_replies == 1
    assert client.hget("f:{bare}", "owner") == b"2"  # one call, two holds
    client.close()


def test_a_retried_call_whose_first_reply_timed_out_applies_once(
    private_server: RedisServer, proxy: FaultProxy
) -> None:
    """A timeout is not resent by the engine; the caller's own retry reuses its request id."""
    direct = private_server.client()
    with LockClient(f"{proxy.url}?socket_timeout=1.0", key_prefix="f") as client:
        lock = client.lock("quiet")
        lock.acquire()  # loads the scripts: from now on each call is one EVALSHA
        lock.release()
        key, owner = lock.keys.hash, thread_owner()

        proxy.swallow_reply_after(b"EVALSHA")
        with pytest.raises(LockUnavailableError):
            lock.acquire()  # Redis granted it; the reply never came
        assert int(direct.hget(key, owner) or 0) == 1
        assert lock.acquire()  # the caller retries: reported, not re-entered
        assert int(direct.hget(key, owner) or 0) == 1
        assert lock.hold_count() == 1

        proxy.swallow_reply_after(b"EVALSHA")
        with pytest.raises(LockUnavailableError):
            lock.release()  # Redis released it; the reply never came
        assert not direct.exists(key)
        lock.release()  # the retry reports the first release: no error, nothing more
        assert proxy.dropped_replies == 2
        assert not direct.exists(key)
        assert lock.acquire(blocking=False)
        lock.release()
    direct.close()


@pytest.mark.parametrize("engine", ["sync", "asyncio"])
def test_a_hold_given_up_after_an_unanswered_release_is_not_re_entered(
    private_server: RedisServer, proxy: FaultProxy, engine: str
) -> None:
    """Found by the model soak: a release that never reached Redis left the hold there.

    The client had given the hold up (the outcome was unknown), so the owner's
    next acquire re-entered it: the old token handed out as a new grant, and
    one hold more on the server than the client knew of, so the lock outlived
    the owner's next release. That acquire now takes the hold off first.
    """
    direct = private_server.client()
    url = f"{proxy.url}?socket_timeout=1.0"
    if engine == "sync":
        with LockClient(url, key_prefix="f") as client:
            lock = client.lock("unanswered")
            assert lock.acquire(lease=30)
            first = lock.token
            proxy.blackhole()
            with pytest.raises(LockUnavailableError):
                lock.release()  # never reaches Redis
            proxy.heal()
            assert owner_counts(direct, lock.keys.hash) == {thread_owner(): 1}
            assert lock.acquire(blocking=False)
            tokens = (first, lock.token)
            counts = owner_counts(direct, lock.keys.hash)
            lock.release()
    else:

        async def scenario() -> tuple[tuple[int | None, int | None], dict[str, int]]:
            async with AsyncLockClient(url, key_prefix="f") as client:
                lock = client.lock("unanswered")
                assert await lock.acquire(lease=30)
                first = lock.token
                proxy.blackhole()
                with pytest.raises(LockUnavailableError):
                    await lock.release()
                proxy.heal()
                assert owner_counts(direct, lock.keys.hash) == {task_owner(): 1}
                assert await lock.acquire(blocking=False)
                again = lock.token
                counts = owner_counts(direct, lock.keys.hash)
                await lock.release()
            return (first, again), counts

        tokens, counts = asyncio.run(scenario())
    first, again = tokens
    assert first is not None and again is not None and again > first  # a new grant
    assert list(counts.values()) == [1]
    assert not direct.exists("f:{unanswered}")  # the owner's release freed it
    direct.close()


def test_the_release_after_a_timed_out_partial_release_is_a_release_of_its_own(
    private_server: RedisServer, proxy: FaultProxy
) -> None:
    """A release whose reply timed out counts as done, so the next one is not its retry.

    It used to reuse the first one's request id, which the latch then reported
    instead of applying: the owner had given back both holds, and the server
    still counted one (the lock outlived the owner's last release).
    """
    direct = private_server.client()
    with LockClient(f"{proxy.url}?socket_timeout=1.0", key_prefix="f") as client:
        lock = client.lock("partial")
        lock.acquire()  # loads the scripts: from now on each call is one EVALSHA
        lock.release()
        assert lock.acquire(lease=30)
        assert lock.acquire(lease=30)
        proxy.swallow_reply_after(b"EVALSHA")
        with pytest.raises(LockUnavailableError):
            lock.release()  # Redis released one hold; the reply never came
        assert owner_counts(direct, lock.keys.hash) == {thread_owner(): 1}
        lock.release()  # the owner's last hold
        assert not direct.exists(lock.keys.hash)
        assert lock.token is None and not lock.lost
    direct.close()
