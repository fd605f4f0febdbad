"""The asyncio lean command path (_aio/wire.py): where it can fail differently from redis-py's.

An asyncio client sends its acquires and releases, packed by the library, on
one connection of its own whose socket it took over from redis-py; these tests
break that path on a real redis-server (a flushed script cache, an error
reply, out of memory, a connection killed between calls or under a call, a
server that stops answering, other protocols and decodings, connections it
must not take over) and check that the outcome is what redis-py's path gives:
the same exceptions, the same holds.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
import redis.asyncio

from django_rlock.core import LockOutOfMemoryError, LockUnavailableError
from django_rlock.core._aio.client import _AsyncLockScript, _AsyncOomSafeScript
from django_rlock.core._aio.wire import _WireProtocol
from django_rlock.core.aio import AsyncLockClient
from tests.servers import RedisServer

HANG = 10.0  # seconds: only ever reached when something hangs


class Paths:
    """How many calls took each path: counts only, every call still runs for real."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.lean = 0
        self.redis_py = 0
        send = _WireProtocol.send
        plain, oom_safe = _AsyncLockScript.__call__, _AsyncOomSafeScript.__call__

        def counted_send(protocol: _WireProtocol, call: Any) -> None:
            self.lean += 1
            send(protocol, call)

        def counted(original: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
            async def call(script: Any, *args: Any, **kwargs: Any) -> Any:
                self.redis_py += 1
                return await original(script, *args, **kwargs)

            return call

        monkeypatch.setattr(_WireProtocol, "send", counted_send)
        monkeypatch.setattr(_AsyncLockScript, "__call__", counted(plain))
        # An allow-oom script runs its variants through _AsyncLockScript: not counted twice.
        monkeypatch.setattr(_AsyncOomSafeScript, "__call__", oom_safe)


@pytest.fixture
def paths(monkeypatch: pytest.MonkeyPatch) -> Paths:
    return Paths(monkeypatch)


def run(scenario: Awaitable[Any]) -> Any:
    async def bounded() -> Any:
        async with asyncio.timeout(HANG * 3):
            return await scenario

    return asyncio.run(bounded())


def wire_address(client: AsyncLockClient) -> str:
    """``host:port`` of the client's lean connection, as CLIENT LIST names it."""
    protocol = client._wire._protocol
    assert protocol is not None, "the lean connection is not open"
    host, port = protocol._transport.get_extra_info("sockname")[:2]
    return f"{host}:{port}"


def test_acquire_and_release_are_sent_on_the_lean_path(redis_url: str, paths: Paths) -> None:
    async def scenario() -> None:
        async with AsyncLockClient(redis_url, key_prefix="test") as client:
            lock = client.lock("lean")
            async with lock:  # the scripts loaded (a fresh server has none)
                pass
            lean, redis_py = paths.lean, paths.redis_py
            async with lock, lock:
                assert await lock.hold_count() == 2
            assert not await lock.locked()
            assert (paths.lean - lean, paths.redis_py - redis_py) == (4, 0)

    run(scenario())


def test_a_flushed_script_cache_costs_one_reload(
    redis_url: str, r: redis.Redis, paths: Paths
) -> None:
    async def scenario() -> None:
        async with AsyncLockClient(redis_url, key_prefix="test") as client:
            lock = client.lock("flushed")
            async with lock:
                pass
            r.script_flush()
            redis_py = paths.redis_py
            async with lock:  # NOSCRIPT on the lean path: redis-py's path loads and runs it
                assert await lock.owned() and await lock.hold_count() == 1
            assert paths.redis_py - redis_py == 2
            lean = paths.lean
            async with lock:  # both loaded again: the lean path alone
                pass
            assert (paths.lean - lean, paths.redis_py - redis_py) == (2, 2)

    run(scenario())


def test_an_error_reply_raises_what_redis_pys_path_raises(redis_url: str, r: redis.Redis) -> None:
    async def attempt(client: AsyncLockClient) -> redis.ResponseError:
        lock = client.lock("wrong-type")
        r.set(lock.keys.hash, "not a hash")  # the script's HEXISTS answers WRONGTYPE
        with pytest.raises(redis.ResponseError) as raised:
            await lock.acquire(blocking=False)
        r.delete(lock.keys.hash)
        assert await lock.acquire(blocking=False)  # the connection is still usable
        await lock.release()
        return raised.value

    async def scenario() -> None:
        async with AsyncLockClient(redis_url, key_prefix="test") as lean_client:
            lean = await attempt(lean_client)
            assert lean_client._wire.lean
        async with AsyncLockClient(_not_taken_over(redis_url), key_prefix="test") as plain_client:
            plain = await attempt(plain_client)
            assert not plain_client._wire.lean
        assert type(lean) is type(plain)
        assert "WRONGTYPE" in str(lean) and "WRONGTYPE" in str(plain)

    run(scenario())


def test_out_of_memory_refuses_a_grant_and_still_lets_a_release_through(
    redis_url: str, r: redis.Redis
) -> None:
    major = int(str(r.info("server")["redis_version"]).split(".", maxsplit=1)[0])
    if major < 7:
        # As tests/faults/test_eviction.py: Redis 6.2 refuses a script under OOM
        # with its own error text, and a release too (the documented limit).
        pytest.skip("releasing under OOM needs allow-oom scripts (Redis >= 7)")

    async def scenario() -> None:
        async with AsyncLockClient(redis_url, key_prefix="test") as client:
            held, other = client.lock("oom-held"), client.lock("oom-other")
            assert await held.acquire()
            r.config_set("maxmemory-policy", "noeviction")
            r.config_set("maxmemory", 1)
            try:
                with pytest.raises(LockOutOfMemoryError):
                    await other.acquire(blocking=False)
                if major >= 7:  # allow-oom: a release runs under OOM (docs: a Redis 7 feature)
                    await held.release()
                    assert not await held.locked()
            finally:
                r.config_set("maxmemory", 0)
            if major < 7:
                await held.release()

    run(scenario())


def test_a_connection_killed_between_calls_is_made_again(redis_url: str, r: redis.Redis) -> None:
    async def scenario() -> None:
        async with AsyncLockClient(redis_url, key_prefix="test") as client:
            lock = client.lock("killed")
            assert await lock.acquire()
            r.client_kill(wire_address(client))
            await lock.release()  # resent on a new connection; the request latch keeps it once
            assert not await lock.locked()
            assert await lock.acquire(blocking=False)
            r.client_kill(wire_address(client))
            assert await lock.acquire(blocking=False)  # a re-entry, sent on a new connection
            assert await lock.hold_count() == 2
            await lock.release()
            await lock.release()
            assert not await lock.locked()

    run(scenario())


def test_a_call_whose_connection_breaks_under_it_is_counted_once(
    redis_url: str, r: redis.Redis
) -> None:
    async def scenario() -> None:
        async with AsyncLockClient(redis_url, key_prefix="test") as client:
            lock = client.lock("broken-under")
            assert await lock.acquire()
            # Paused, Redis holds the re-entry unrun; the kill then drops the
            # connection it came on: whether it ran is unknown to the client,
            # which sends it again with its request id.
            address = wire_address(client)

            async def kill_then_unpause() -> None:
                await asyncio.sleep(0.05)  # the re-entry is on its way
                r.client_kill(address)
                r.client_unpause()

            r.client_pause(500, all=False)
            breaker = asyncio.ensure_future(kill_then_unpause())
            assert await lock.acquire(blocking=False)  # this task's: a re-entry
            await breaker
            assert await lock.hold_count() == 2
            await lock.release()
            await lock.release()
            assert not await lock.locked()

    run(scenario())


def test_a_server_that_stops_answering_times_a_call_out_and_the_retry_applies_once(
    redis_url: str, r: redis.Redis
) -> None:
    async def scenario() -> None:
        url = f"{redis_url}?socket_timeout=0.25"
        async with AsyncLockClient(url, key_prefix="test") as client:
            lock = client.lock("paused")
            async with lock:  # connected, scripts loaded
                pass
            r.client_pause(1500)  # every client: the call waits, unrun, until the pause ends
            started = time.monotonic()
            with pytest.raises(LockUnavailableError):
                await lock.acquire()  # no reply within 0.25 s: not resent
            assert time.monotonic() - started < HANG
            r.client_unpause()
            # The first acquire may have run once the pause ended: the retry
            # carries its request id, and is reported, not re-entered.
            assert await lock.acquire()
            assert await lock.hold_count() == 1
            await lock.release()
            assert not await lock.locked()

    run(scenario())


@pytest.mark.parametrize(
    "query",
    ["protocol=2", "protocol=3", "decode_responses=True"],
    ids=["resp2", "resp3", "decoded"],
)
def test_replies_of_any_decoding_or_protocol(redis_url: str, query: str, paths: Paths) -> None:
    async def scenario() -> None:
        async with AsyncLockClient(f"{redis_url}?{query}", key_prefix="test") as client:
            lock = client.lock("decoded")
            async with lock, lock:
                assert await lock.hold_count() == 2
                assert lock.token is not None and lock.token > 0
            assert not await lock.locked()
            assert client._wire.lean
        assert paths.lean > 0

    run(scenario())


def test_a_unix_socket_is_taken_over_too(paths: Paths) -> None:
    with RedisServer("--unixsocket", "redis.sock", "--unixsocketperm", "700") as server:
        path = f"{server.dir}/redis.sock"

        async def scenario() -> None:
            async with AsyncLockClient(f"unix://{path}", key_prefix="test") as client:
                lock = client.lock("unix")
                async with lock, lock:
                    assert await lock.hold_count() == 2
                assert not await lock.locked()
                assert client._wire.lean

        run(scenario())
    assert paths.lean > 0


class _Own:
    class Connection(redis.asyncio.Connection):
        """A connection class of the caller's own (named as redis-py's): it may do more."""


def _not_taken_over(url: str) -> redis.asyncio.Redis:
    pool = redis.asyncio.BlockingConnectionPool.from_url(
        url, timeout=None, connection_class=_Own.Connection
    )
    return redis.asyncio.Redis(connection_pool=pool)


@pytest.mark.parametrize("case", ["own connection class", "latin-1"])
def test_connections_it_must_not_take_over_leave_every_call_to_redis_py(
    redis_url: str, case: str, paths: Paths
) -> None:
    async def scenario() -> None:
        caller = (
            _not_taken_over(redis_url)
            if case == "own connection class"
            # Keys are encoded as redis-py encodes them: the lean path packs UTF-8 only.
            else redis.asyncio.Redis.from_url(redis_url, encoding="latin-1")
        )
        async with AsyncLockClient(caller, key_prefix="test") as client:
            lock = client.lock("naïve")
            async with lock, lock:
                assert await lock.hold_count() == 2
                assert await lock.owned()
            assert not await lock.locked()
            assert not client._wire.lean
        await caller.aclose()
        assert paths.lean == 0 and paths.redis_py >= 4

    run(scenario())


def test_a_forked_child_connects_anew_and_leaves_the_parents_connection(redis_url: str) -> None:
    client = AsyncLockClient(redis_url, key_prefix="test")
    lock = client.lock("forked-wire")
    loop = asyncio.new_event_loop()

    async def take() -> tuple[asyncio.Task[None], asyncio.Event]:
        holder_ready, release_now = asyncio.Event(), asyncio.Event()

        async def holder() -> None:
            async with lock:
                holder_ready.set()
                await release_now.wait()

        task = asyncio.ensure_future(holder())
        await holder_ready.wait()
        return task, release_now

    async def in_child() -> str:
        async with asyncio.timeout(HANG):
            return "granted" if await lock.acquire(blocking=False) else "refused"

    try:
        holding, release_now = loop.run_until_complete(take())  # the lean connection is open
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: a new loop, a new connection, an owner of its own
            try:
                report = asyncio.run(in_child())
            except BaseException as error:  # noqa: BLE001 -- any error is reported to the parent
                report = repr(error)
            os.write(write_end, report.encode())
            os._exit(0)
        os.close(write_end)
        _, status = os.waitpid(pid, 0)
        report = os.read(read_end, 200).decode()
        os.close(read_end)
        assert status == 0
        assert report == "refused"

        async def release_in_parent() -> None:
            release_now.set()  # the parent's connection still answers
            async with asyncio.timeout(HANG):
                await holding
                assert not await lock.locked()

        loop.run_until_complete(release_in_parent())
    finally:
        loop.run_until_complete(client.aclose())
        loop.close()
