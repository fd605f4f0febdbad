"""Fixtures of the fault suite: private servers (a fault must not leak into other tests).

Every server, proxy and client made here is torn down by its fixture, also when
a test fails half-way through a fault.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator

import pytest

from tests.faults.proxy import FaultProxy
from tests.servers import RedisServer, redis_server_binary

#: The watchdog timeout of the fault tests: renewals every 0.5 s, each call
#: bounded by 0.25 s, a hold lost 1.5 s after its last renewal.
TIMEOUT = 1.5


def server_major() -> int:
    """Major version of the redis-server binary the suite runs."""
    out = subprocess.run(
        [redis_server_binary(), "--version"], capture_output=True, text=True, check=True
    ).stdout
    version = out.split("v=", 1)[1].split()[0]
    return int(version.split(".", 1)[0])


ServerFactory = Callable[..., RedisServer]


@pytest.fixture
def start_server() -> Iterator[ServerFactory]:
    """Start private redis-servers (``start_server(*args)``); all stopped afterwards."""
    servers: list[RedisServer] = []

    def start(*args: str) -> RedisServer:
        server = RedisServer(*args)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.__exit__(None, None, None)


@pytest.fixture
def private_server(start_server: ServerFactory) -> RedisServer:
    """One private redis-server (DEBUG allowed where the server knows the option)."""
    args = ("--enable-debug-command", "yes") if server_major() >= 7 else ()
    return start_server(*args)


@pytest.fixture
def proxy(private_server: RedisServer) -> Iterator[FaultProxy]:
    """A :class:`FaultProxy` in front of :func:`private_server`; checked to end its threads."""
    with FaultProxy(private_server.port, lifetime=120) as made:
        yield made
    assert made.alive_threads == 0
