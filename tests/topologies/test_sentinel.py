"""Master + replica + 3 sentinels: replica-synced acquisition, then a real failover.

The failover test is last: it leaves the old master dead and the replica promoted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis
from pytest_django.fixtures import Settings as SettingsWrapper
from redis.sentinel import SentinelConnectionPool

from django_rlock.core import LockClient, LockNotReplicatedError, LockUnavailableError
from django_rlock.core._sync.waiting import ReleaseListener
from tests.topologies.builders import SentinelGroup, wait_until
from tests.topologies.conftest import running

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def group() -> Iterator[SentinelGroup]:
    topology = SentinelGroup()
    with running(topology):
        yield topology


@pytest.fixture
def master(group: SentinelGroup) -> Iterator[redis.Redis]:
    host, port = group.master_address()
    client = redis.Redis(host=host, port=port, socket_timeout=2)
    client.flushall()
    yield client
    client.close()


def test_a_sentinel_url_gives_sentinel_managed_connections(
    group: SentinelGroup, master: redis.Redis
) -> None:
    with LockClient(group.url, key_prefix="test") as client:
        assert isinstance(client.redis.connection_pool, SentinelConnectionPool)
        # Renewal and pub/sub ask the sentinels too, so they follow a failover.
        renewal = client._renewal_redis
        assert isinstance(renewal, redis.Redis)
        assert isinstance(renewal.connection_pool, SentinelConnectionPool)
        with client.lock("via-sentinel") as lock:
            assert master.exists(lock.keys.hash)
        assert not master.exists(lock.keys.hash)


def test_a_sentinel_managed_client_can_be_passed_in(
    group: SentinelGroup, master: redis.Redis
) -> None:
    managed = group.sentinel().master_for("rlock-test")  # type: ignore[no-untyped-call, unused-ignore]
    with LockClient(managed, key_prefix="test") as client, client.lock("passed-in") as lock:
        assert master.exists(lock.keys.hash)
    managed.close()


def test_django_rlocks_location_for_sentinel(
    group: SentinelGroup, master: redis.Redis, settings: SettingsWrapper
) -> None:
    from django_rlock import locks  # noqa: PLC0415 -- needs Django settings

    settings.RLOCKS = {"default": {"LOCATION": group.url, "KEY_PREFIX": "test"}}
    backend = locks["default"]
    try:
        with backend.lock("django") as lock:
            assert master.exists(lock.keys.hash)
        assert not master.exists(lock.keys.hash)
    finally:
        backend.close()


def test_min_replicas_confirmed(group: SentinelGroup, master: redis.Redis) -> None:
    with LockClient(group.url, key_prefix="test", min_replicas=1) as client:
        lock = client.lock("synced")
        with lock, lock:  # a re-entry is synced too
            assert lock.hold_count() == 2
        assert not master.exists(lock.keys.hash)


def test_min_replicas_with_the_replica_stopped_fails_and_leaves_no_key(
    group: SentinelGroup, master: redis.Redis
) -> None:
    group.replica.stop()
    try:
        with LockClient(
            group.url, key_prefix="test", min_replicas=1, replica_sync_timeout=0.3
        ) as client:
            lock = client.lock("unsynced")
            started = time.monotonic()
            with pytest.raises(LockNotReplicatedError) as raised:
                lock.acquire()
            assert time.monotonic() - started < 2
            assert raised.value.required == 1
            assert raised.value.acknowledged == 0
            assert raised.value.name == "unsynced"
            assert not master.exists(lock.keys.hash)
            assert lock.hold_count() == 0
            assert lock.token is None
    finally:
        group.replica.start()
        wait_until(group.replica_in_sync, 20, "the replica to sync again")


def test_a_waiter_listening_on_a_replica_is_never_handed_a_lock(
    group: SentinelGroup, master: redis.Redis
) -> None:
    """A listener on a replica hears the master's PUBLISH (replication) but is not counted.

    Where a failover leaves it: a demoted master's subscriber, or one whose
    reconnection asked a sentinel that had not heard of the failover yet. The
    release must not hand it the lock on the strength of a message it hears
    while the master counts it out (the grant would be undone, the waiter
    would hold a lock nobody granted); it is woken, and takes the lock with
    its own acquire.
    """
    with (
        LockClient(group.url, key_prefix="test") as holder_client,
        LockClient(group.url, key_prefix="test") as waiter_client,
        LockClient(group.url, key_prefix="test") as other_client,
    ):
        waiter_client.listener.close()
        on_replica = group.replica.client()
        waiter_client.listener = ReleaseListener(on_replica)
        held = holder_client.lock("replica-listener")
        assert held.acquire()
        waiting = waiter_client.lock("replica-listener")
        seen: dict[str, object] = {}

        def try_other() -> None:
            seen["other"] = other_client.lock("replica-listener").acquire(blocking=False)

        def wait() -> None:
            try:
                if waiting.acquire(timeout=30):
                    seen["handoff"] = master.hget(held.keys.hash, "~handoff")
                    # Held for real: another owner (another thread) cannot take it meanwhile.
                    other = threading.Thread(target=try_other)
                    other.start()
                    other.join(20)
                    waiting.release()
                    seen["released"] = True
            except Exception as error:  # noqa: BLE001 -- reported by the test thread
                seen["error"] = error

        thread = threading.Thread(target=wait)
        thread.start()
        wait_until(lambda: master.zcard(held.keys.waiters) == 1, 20, "the waiter registered")
        time.sleep(0.05)  # it has waited past STARVING_AFTER: the release would hand it over
        held.release()
        thread.join(40)
        on_replica.close()
    assert not thread.is_alive()
    assert "error" not in seen, seen
    assert seen.get("released") is True
    assert seen["other"] is False  # no overlap
    assert seen["handoff"] is None  # granted by its own acquire, not handed


def test_failover_the_client_keeps_working(group: SentinelGroup, master: redis.Redis) -> None:
    old_address = group.master_address()
    with LockClient(group.url, key_prefix="test", watchdog_timeout=10, min_replicas=1) as client:
        held = client.lock("through-failover")
        held.acquire()  # confirmed by the replica, so it survives the promotion
        group.master.stop()
        wait_until(lambda: group.master_address() != old_address, 30, "the sentinels' failover")
        new_host, new_port = group.master_address()
        promoted = redis.Redis(host=new_host, port=new_port, socket_timeout=2)
        wait_until(
            lambda: promoted.info("replication").get("role") == "master",
            10,
            "the replica to become master",
        )
        assert promoted.exists(held.keys.hash)
        # The watchdog's renewal connection finds the new master by itself: the
        # key's PTTL goes back up (a renewal every 10/3 s) after having gone down.
        lowest = [int(promoted.pttl(held.keys.hash))]

        def renewed() -> bool:
            ttl = int(promoted.pttl(held.keys.hash))
            lowest[0] = min(lowest[0], ttl)
            return ttl > lowest[0] + 500

        wait_until(renewed, 8, "a renewal on the promoted master")
        with LockClient(group.url, key_prefix="test", watchdog_timeout=10) as unsynced:
            # min_replicas=1 would now fail: the promoted master has no replica left.
            other = unsynced.lock("after-failover")
            deadline = time.monotonic() + 10
            while True:  # the first calls may still hit the dead master's sockets
                try:
                    assert other.acquire(timeout=5)
                    break
                except LockUnavailableError:
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
            assert promoted.exists(other.keys.hash)
            other.release()
        assert not held.lost
        assert held.owned()
        held.release()
        assert not promoted.exists(held.keys.hash)
        promoted.close()
