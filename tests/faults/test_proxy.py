"""The fault proxy itself: it forwards, blackholes, drops replies, and ends its threads."""

from __future__ import annotations

import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.faults.proxy import FaultProxy
from tests.servers import RedisServer

pytestmark = pytest.mark.faults


def test_proxy_forwards_blackholes_and_heals(private_server: RedisServer) -> None:
    with FaultProxy(private_server.port) as proxy:
        client = redis.Redis(
            host="127.0.0.1", port=proxy.port, socket_timeout=0.3, retry=Retry(NoBackoff(), 0)
        )
        client.set("k", "v")
        assert client.get("k") == b"v"
        proxy.blackhole()
        started = time.monotonic()
        with pytest.raises(redis.TimeoutError):
            client.get("k")
        assert time.monotonic() - started < 0.3 + 0.2
        proxy.heal()
        assert client.get("k") == b"v"
        client.close()
    assert proxy.alive_threads == 0


def test_proxy_threads_end_by_themselves_when_its_lifetime_runs_out(
    private_server: RedisServer,
) -> None:
    proxy = FaultProxy(private_server.port, lifetime=0.5)
    client = redis.Redis(host="127.0.0.1", port=proxy.port)
    assert client.ping()
    deadline = time.monotonic() + 3
    while proxy.alive_threads and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proxy.alive_threads == 0 and proxy.connections == 0
    client.close()
    proxy.close()
