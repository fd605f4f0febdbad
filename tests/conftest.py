"""Fixtures shared by every test: a real redis-server and clients of it."""

from __future__ import annotations

import faulthandler
import sys
from collections.abc import Iterator

import pytest
import redis

from django_rlock.core import LockClient
from tests.servers import RedisServer

#: Seconds after which a test (setup, call and teardown together) ends the run,
#: with every thread's stack printed. pytest-timeout's 120 s (setup.cfg) fails
#: the test first; this catches what that cannot end: a teardown still stuck
#: after it fired, or a thread that keeps the process from exiting. A hung run
#: must fail with its stacks in CI's log, not sit until CI's own limit.
HARD_STOP = 300


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    faulthandler.dump_traceback_later(HARD_STOP, exit=True, file=sys.stderr)
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def r(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A plain client of the test server, on an emptied database."""
    client = redis_server.client()
    client.flushall()
    client.config_resetstat()
    yield client
    client.close()


@pytest.fixture
def lock_client(r: redis.Redis, redis_url: str) -> Iterator[LockClient]:
    with LockClient(redis_url, key_prefix="test") as client:
        yield client
