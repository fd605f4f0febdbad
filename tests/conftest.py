"""Fixtures shared by every test: a real redis-server and clients of it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from django_rlock.core import LockClient
from tests.servers import RedisServer


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
