"""MultiLock on three independent servers: all or nothing, leases, watchdog, loss."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from django_rlock.core import LockClient, LockLostError, LockNotOwnedError, LockTimeout
from django_rlock.core._sync.multilock import MultiLock
from tests.servers import RedisServer

pytestmark = pytest.mark.slow

NAMES = ("a", "b", "c")


@pytest.fixture
def three(servers: list[RedisServer]) -> list[RedisServer]:
    return servers[:3]


@pytest.fixture
def clients(three: list[RedisServer]) -> Iterator[list[LockClient]]:
    made = [LockClient(server.url, key_prefix="test", watchdog_timeout=1) for server in three]
    yield made
    for client in made:
        client.close()


@pytest.fixture
def multi(clients: list[LockClient]) -> MultiLock:
    return clients[0].multi_lock(
        *(client.lock(name) for client, name in zip(clients, NAMES, strict=True))
    )


def hold_elsewhere(server: RedisServer, name: str, ms: int) -> None:
    """Make ``name`` held by another owner for ``ms`` milliseconds."""
    raw = server.client()
    raw.hset(f"test:{{{name}}}", "another-process:1", 1)
    raw.pexpire(f"test:{{{name}}}", ms)
    raw.close()


def keys_left(three: list[RedisServer]) -> list[str]:
    left = []
    for server, name in zip(three, NAMES, strict=False):
        raw = server.client()
        if raw.exists(f"test:{{{name}}}"):
            left.append(name)
        raw.close()
    return left


def test_acquire_and_release_all(multi: MultiLock, three: list[RedisServer]) -> None:
    with multi:
        assert keys_left(three) == ["a", "b", "c"]
        assert multi.owned()
        assert multi.locked()
        token = multi.token
        assert token is not None and all(isinstance(each, int) for each in token)
    assert keys_left(three) == []
    assert not multi.locked()
    assert multi.token is None


def test_one_busy_member_leaves_nothing_held_anywhere(
    multi: MultiLock, three: list[RedisServer]
) -> None:
    hold_elsewhere(three[1], "b", 10_000)
    assert not multi.acquire(blocking=False)
    assert keys_left(three) == ["b"]
    started = time.monotonic()
    assert not multi.acquire(timeout=0.5)
    assert 0.5 <= time.monotonic() - started < 2.0
    assert keys_left(three) == ["b"]
    raw = three[1].client()
    assert raw.hkeys("test:{b}") == [b"another-process:1"]  # the other holder is untouched
    raw.close()
    with pytest.raises(LockTimeout), MultiLock(*multi.locks, timeout=0.2):
        pass
    assert keys_left(three) == ["b"]


def test_waits_until_the_busy_member_frees(multi: MultiLock, three: list[RedisServer]) -> None:
    hold_elsewhere(three[2], "c", 400)
    started = time.monotonic()
    assert multi.acquire(timeout=5)
    assert time.monotonic() - started < 3
    assert keys_left(three) == ["a", "b", "c"]
    multi.release()
    assert keys_left(three) == []


def test_a_lease_is_set_on_every_member_together(
    multi: MultiLock, three: list[RedisServer]
) -> None:
    # "b" is busy for 0.5 s, so "a" is taken well before "b" and "c".
    hold_elsewhere(three[1], "b", 500)
    assert multi.acquire(timeout=5, lease=2)
    ttls = []
    for server, name in zip(three, NAMES, strict=False):
        raw = server.client()
        ttls.append(raw.pttl(f"test:{{{name}}}"))
        raw.close()
    assert all(1500 < ttl <= 2000 for ttl in ttls), ttls
    assert max(ttls) - min(ttls) < 200, ttls  # "a" was re-expired with the others
    multi.release()


def test_the_watchdog_renews_every_member(multi: MultiLock, three: list[RedisServer]) -> None:
    multi.acquire()
    deadline = time.monotonic() + 2.5  # 2.5 watchdog timeouts
    while time.monotonic() < deadline:
        assert keys_left(three) == ["a", "b", "c"]
        time.sleep(0.1)
    assert not multi.lost
    multi.release()
    assert keys_left(three) == []


def test_a_killed_server_is_reported_lost(multi: MultiLock, three: list[RedisServer]) -> None:
    reported = threading.Event()
    multi.on_lost(lambda lock: reported.set())
    multi.acquire()
    three[2].stop()
    assert reported.wait(5), "on_lost did not run within 5 s of the server's death"
    assert multi.lost
    with pytest.raises(LockLostError, match="'c'"):
        multi.release()
    assert keys_left(three[:2]) == []  # the living members were released
    assert multi.lost  # stays true until the thread acquires again


def test_reentrant_per_thread(multi: MultiLock, three: list[RedisServer]) -> None:
    with multi:
        with multi:
            assert multi.hold_count() == 2
            assert all(lock.hold_count() == 2 for lock in multi.locks)
            other: list[bool] = []
            thread = threading.Thread(target=lambda: other.append(multi.acquire(blocking=False)))
            thread.start()
            thread.join(5)
            assert other == [False]  # another thread is another owner
        assert multi.hold_count() == 1
        assert keys_left(three) == ["a", "b", "c"]
    assert keys_left(three) == []
    with pytest.raises(LockNotOwnedError):
        multi.release()


def test_bad_members_are_refused(clients: list[LockClient]) -> None:
    with pytest.raises(ValueError, match="at least one"):
        clients[0].multi_lock()
    with pytest.raises(ValueError, match="RLock"):
        clients[0].multi_lock("a")  # type: ignore[arg-type]
