"""Redis unreachable: every lock call raises LockUnavailableError naming the server.

The server is a real redis-server with a password, stopped half-way: the error
names the URL without its credentials, the lock, and chains redis-py's error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from django_rlock.core import LockClient, LockError, LockUnavailableError
from django_rlock.core.aio import AsyncLockClient
from tests.servers import RedisServer, free_port

PASSWORD = "s3cret-pw"


@pytest.fixture
def guarded_server() -> Iterator[RedisServer]:
    """A private redis-server that wants a password (stopped by the test)."""
    with RedisServer() as server:
        with server.client() as admin:
            admin.config_set("requirepass", PASSWORD)
        yield server


def url_of(server: RedisServer) -> str:
    return f"redis://:{PASSWORD}@127.0.0.1:{server.port}/0?socket_connect_timeout=2"


def assert_unavailable(error: BaseException, *, name: str | None, port: int, what: str) -> None:
    assert isinstance(error, LockUnavailableError), what
    assert isinstance(error, LockError) and isinstance(error, ConnectionError)
    assert error.name == name
    assert error.server == f"redis://***@127.0.0.1:{port}/0?socket_connect_timeout=2"
    assert PASSWORD not in str(error)
    assert error.server in str(error)
    if name is not None:
        assert repr(name) in str(error)
    assert isinstance(error.__cause__, redis.RedisError)


def test_every_sync_call_names_the_url_without_its_password(
    guarded_server: RedisServer,
) -> None:
    with LockClient(url_of(guarded_server), key_prefix="u") as client:
        held = client.lock("held")
        free = client.lock("free")
        assert held.acquire()
        guarded_server.stop()
        calls: dict[str, tuple[str, Callable[[], Any]]] = {
            "release": ("held", held.release),
            "locked": ("held", held.locked),
            "owned": ("held", held.owned),
            "hold_count": ("held", held.hold_count),
            "ttl": ("held", held.ttl),
            "force_release": ("held", held.force_release),
            "acquire(blocking=False)": ("free", lambda: free.acquire(blocking=False)),
            "acquire(timeout=1)": ("free", lambda: free.acquire(timeout=1)),
            "with": ("free", free.__enter__),
        }
        for what, (name, call) in calls.items():
            with pytest.raises(LockUnavailableError) as caught:
                call()
            assert_unavailable(caught.value, name=name, port=guarded_server.port, what=what)


def test_a_refused_connection_on_first_use_is_unavailable_too() -> None:
    port = free_port()
    with (
        LockClient(f"redis://127.0.0.1:{port}/0", key_prefix="u") as client,
        pytest.raises(LockUnavailableError, match=rf"redis://127\.0\.0\.1:{port}/0"),
    ):
        client.lock("x").acquire()


def test_a_client_instance_is_named_by_host_and_port() -> None:
    port = free_port()
    caller = redis.Redis(host="127.0.0.1", port=port, password=PASSWORD)
    with (
        LockClient(caller, key_prefix="u") as client,
        pytest.raises(LockUnavailableError) as caught,
    ):
        client.lock("x").locked()
    assert caught.value.server == f"127.0.0.1:{port}"
    assert PASSWORD not in str(caught.value)
    caller.close()


def test_every_async_call_names_the_url_without_its_password(
    guarded_server: RedisServer,
) -> None:
    async def scenario() -> None:
        async with AsyncLockClient(url_of(guarded_server), key_prefix="u") as client:
            held = client.lock("held")
            free = client.lock("free")
            assert await held.acquire()
            guarded_server.stop()
            calls: dict[str, tuple[str, Callable[[], Any]]] = {
                "release": ("held", held.release),
                "locked": ("held", held.locked),
                "ttl": ("held", held.ttl),
                "force_release": ("held", held.force_release),
                "acquire(blocking=False)": ("free", lambda: free.acquire(blocking=False)),
                "acquire(timeout=1)": ("free", lambda: free.acquire(timeout=1)),
                "async with": ("free", free.__aenter__),
            }
            for what, (name, call) in calls.items():
                with pytest.raises(LockUnavailableError) as caught:
                    await call()
                assert_unavailable(caught.value, name=name, port=guarded_server.port, what=what)

    asyncio.run(scenario())
