"""A lock server that can evict lock keys is named in an ERROR, once per server per process.

Each test runs a redis-server of its own (the report is once per server), and
joins the probe thread that :func:`report_eviction_policy` returns.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator

import pytest
import redis

from django_rlock._observers.eviction import maxmemory_policy, report_eviction_policy
from django_rlock.core import LockClient
from tests.servers import RedisServer

HANG = 10.0
LOGGER = "django_rlock.lock"


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as started:
        yield started


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == LOGGER and record.levelno == logging.ERROR
    ]


def _report(client: LockClient) -> threading.Thread | None:
    probe = report_eviction_policy(client)
    if probe is not None:
        probe.join(HANG)
        assert not probe.is_alive()
    return probe


@pytest.mark.parametrize("policy", ["volatile-lru", "allkeys-lru", "volatile-ttl"])
def test_an_evicting_policy_is_an_error_once_per_server(
    server: RedisServer, policy: str, caplog: pytest.LogCaptureFixture
) -> None:
    server.client().config_set("maxmemory-policy", policy)
    with (
        caplog.at_level(logging.DEBUG, logger=LOGGER),
        LockClient(server.url, server="RLOCKS['default']") as first,
        LockClient(server.url, server="RLOCKS['other']") as second,
    ):
        assert _report(first) is not None
        assert _report(first) is None  # once per server...
        assert _report(second) is None  # ...whichever alias connects to it
    (error,) = _errors(caplog)
    assert "RLOCKS['default']" in error and repr(policy) in error
    assert "noeviction" in error and "docs/guarantees.md" in error


def test_noeviction_says_nothing(server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger=LOGGER), LockClient(server.url) as client:
        assert _report(client) is not None
    assert _errors(caplog) == []


def test_the_policy_is_read_from_info_where_config_is_refused(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    admin = server.client()
    admin.config_set("maxmemory-policy", "volatile-lru")
    admin.execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", "noconfig", "reset", "on", ">pw", "~*", "&*", "+@all", "-config"
    )
    url = server.url.replace("redis://", "redis://noconfig:pw@", 1)
    user = redis.Redis.from_url(url)
    with pytest.raises(redis.exceptions.NoPermissionError):
        user.config_get("maxmemory-policy")
    assert maxmemory_policy(user) == "volatile-lru"
    user.close()
    with caplog.at_level(logging.DEBUG, logger=LOGGER), LockClient(url) as client:
        _report(client)
    assert len(_errors(caplog)) == 1
    admin.close()


def test_a_server_that_refuses_both_is_a_debug_line(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    admin = server.client()
    admin.config_set("maxmemory-policy", "volatile-lru")
    admin.execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", "locker", "reset", "on", ">pw", "~*", "&*", "+@all", "-config", "-info"
    )
    url = server.url.replace("redis://", "redis://locker:pw@", 1)
    with caplog.at_level(logging.DEBUG, logger=LOGGER), LockClient(url) as client:
        _report(client)
    assert _errors(caplog) == []
    assert any("could not read the maxmemory-policy" in r.getMessage() for r in caplog.records)
    admin.close()


def test_a_server_that_does_not_answer_never_holds_up_the_caller(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Accepts connections and never answers, until the test closes them.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        accepted: list[socket.socket] = []
        acceptor = threading.Thread(target=lambda: accepted.append(silent.accept()[0]))
        acceptor.start()
        with caplog.at_level(logging.DEBUG, logger=LOGGER):
            client = LockClient(f"redis://127.0.0.1:{port}/0")
            probe = report_eviction_policy(client)  # returns at once...
            assert probe is not None
            acceptor.join(HANG)
            assert probe.is_alive()  # ...while the probe still waits for an answer
            accepted[0].close()
            probe.join(HANG)
            client.close()
    assert not probe.is_alive()
    assert _errors(caplog) == []
    assert any("could not read the maxmemory-policy" in r.getMessage() for r in caplog.records)
