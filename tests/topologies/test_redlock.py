"""RedLock on 3 and 5 real servers: majorities, no keys left on failure, validity."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from django_rlock.core import LockClient, LockLostError, RedLock
from django_rlock.core._protocol import clock
from django_rlock.core._sync.multilock import validity_time
from tests.servers import RedisServer

pytestmark = pytest.mark.slow


@pytest.fixture
def clients(servers: list[RedisServer]) -> Iterator[list[LockClient]]:
    made = [LockClient(server.url, key_prefix="test", watchdog_timeout=1) for server in servers]
    yield made
    for client in made:
        client.close()


def red_lock(clients: list[LockClient], count: int) -> RedLock:
    return clients[0].red_lock(*(client.lock("red") for client in clients[:count]))


def holders(servers: list[RedisServer]) -> int:
    """How many running servers hold the key."""
    held = 0
    for server in servers:
        if server.process is None:
            continue
        raw = server.client()
        held += int(raw.exists("test:{red}"))
        raw.close()
    return held


@pytest.mark.parametrize(("count", "down"), [(3, 1), (5, 2)])
def test_succeeds_with_a_minority_down(
    servers: list[RedisServer], clients: list[LockClient], count: int, down: int
) -> None:
    for server in servers[:down]:
        server.stop()
    lock = red_lock(clients, count)
    assert lock.acquire(blocking=False, lease=10)
    assert holders(servers[:count]) == count - down
    token = lock.token
    assert token is not None and token[:down] == (None,) * down
    assert lock.owned()
    assert not lock.lost
    lock.release()
    assert holders(servers[:count]) == 0


@pytest.mark.parametrize(("count", "down"), [(3, 2), (5, 3)])
def test_fails_with_a_majority_down_and_leaves_no_key(
    servers: list[RedisServer], clients: list[LockClient], count: int, down: int
) -> None:
    for server in servers[:down]:
        server.stop()
    lock = red_lock(clients, count)
    assert not lock.acquire(blocking=False, lease=10)
    assert holders(servers[:count]) == 0
    started = time.monotonic()
    assert not lock.acquire(timeout=0.5, lease=10)  # retries after random delays
    assert time.monotonic() - started < 2
    assert holders(servers[:count]) == 0
    assert lock.hold_count() == 0


def test_fails_when_a_majority_is_held_elsewhere(
    servers: list[RedisServer], clients: list[LockClient]
) -> None:
    for server in servers[:2]:
        raw = server.client()
        raw.hset("test:{red}", "another-process:1", 1)
        raw.pexpire("test:{red}", 10_000)
        raw.close()
    lock = red_lock(clients, 3)
    assert not lock.acquire(blocking=False, lease=10)
    assert holders(servers[2:3]) == 0  # the one it got was given back
    assert lock.locked()


def test_validity_arithmetic() -> None:
    assert validity_time(10.0, 0.0) == pytest.approx(10 - 0.1 - 0.002)
    assert validity_time(10.0, 1.5) == pytest.approx(10 - 1.5 - 0.1 - 0.002)
    assert validity_time(1.0, 0.99) < 0


def test_validity_of_a_grant(clients: list[LockClient]) -> None:
    lock = red_lock(clients, 5)
    started = time.monotonic()
    assert lock.acquire(blocking=False, lease=10)
    took = time.monotonic() - started
    assert lock.validity is not None
    assert 10 - 0.102 - took <= lock.validity <= 10 - 0.102
    lock.release()
    assert lock.validity is None


def test_a_grant_slower_than_its_lease_fails_and_leaves_no_key(
    servers: list[RedisServer], clients: list[LockClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every reading of the clock is 0.4 s later than the one before, so
    # taking the members seems to take longer than the 1 s lease.
    ticks = itertools.count()
    monkeypatch.setattr(clock, "monotonic", lambda: next(ticks) * 0.4)
    lock = red_lock(clients, 3)
    assert not lock.acquire(blocking=False, lease=1)
    monkeypatch.undo()
    assert holders(servers[:3]) == 0


def test_a_hung_server_costs_one_short_call_timeout(
    servers: list[RedisServer], clients: list[LockClient]
) -> None:
    process = servers[0].process
    assert process is not None
    os.kill(process.pid, signal.SIGSTOP)
    try:
        lock = red_lock(clients, 3)
        started = time.monotonic()
        assert lock.acquire(blocking=False, lease=10)  # call timeout: 10 / 30 s -> 0.2 s
        assert time.monotonic() - started < 1.0
        assert lock.validity is not None and lock.validity > 9
        lock.release()
        assert time.monotonic() - started < 2.0
    finally:
        os.kill(process.pid, signal.SIGCONT)
    assert holders(servers[1:3]) == 0
    # The hung server runs the buffered attempt once resumed: a grant it makes
    # that late is unknown to us and simply expires with its lease.
    raw = servers[0].client()
    assert raw.pttl("test:{red}") <= 10_000
    raw.close()


def test_survives_a_minority_lost_while_held(servers: list[RedisServer]) -> None:
    # Renewed every second, each call given half a second: the clients fixture's
    # watchdog_timeout=1 gave a renewal a sixth of a second, which a loaded
    # machine's slow reply from a live member could miss (a second member lost).
    watched = [LockClient(server.url, key_prefix="test", watchdog_timeout=3) for server in servers]
    try:
        reported = threading.Event()
        lock = red_lock(watched, 3)
        lock.on_lost(lambda _lock: reported.set())
        assert lock.acquire()  # watchdog-renewed members
        servers[0].stop()
        time.sleep(3.5)  # past the stopped member's deadline (3 s after its last renewal)
        assert not lock.lost
        assert not reported.is_set()
        servers[1].stop()
        assert reported.wait(15), "on_lost did not run once a majority was gone"
        assert lock.lost
        with pytest.raises(LockLostError):
            lock.release()
        assert holders(servers[2:3]) == 0
    finally:
        for client in watched:
            client.close()


def test_each_member_needs_its_own_client(clients: list[LockClient]) -> None:
    with pytest.raises(ValueError, match="own LockClient"):
        clients[0].red_lock(clients[0].lock("x"), clients[0].lock("y"))
