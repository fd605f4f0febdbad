"""A semaphore on a 3-master Redis Cluster: its keys in one slot, waking, renewal."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from redis.cluster import RedisCluster

from django_rlock.core import LockClient
from django_rlock.core.identity import thread_owner
from django_rlock.core.semaphore_scripts import permit_key
from django_rlock.core.sharding import slot_of
from tests.topologies.builders import Cluster
from tests.topologies.conftest import running

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    topology = Cluster(3)
    with running(topology):
        yield topology


@pytest.fixture
def lock_client(cluster: Cluster) -> Iterator[LockClient]:
    raw = cluster.client()
    raw.flushall()
    raw.close()
    with LockClient(cluster.url, key_prefix="test", watchdog_timeout=1) as client:
        yield client


@pytest.mark.parametrize("name", ["plain", "a{b}c", "}{"])
def test_a_semaphores_keys_share_one_slot_and_it_counts(
    lock_client: LockClient, cluster: Cluster, name: str
) -> None:
    semaphore = lock_client.semaphore(name, 2)
    keys = semaphore.keys
    owned = permit_key(keys, thread_owner())
    slots = {slot_of(key) for key in (keys.hash, keys.waiters, keys.channel, owned)}
    assert len(slots) == 1
    assert semaphore.acquire() and semaphore.acquire()
    assert semaphore.available() == 0 and not semaphore.acquire(blocking=False)
    time.sleep(2)  # renewed per slot by the watchdog, past two timeouts
    assert semaphore.hold_count() == 2 and not semaphore.lost
    semaphore.release()
    semaphore.release()
    raw: RedisCluster = cluster.client()
    assert not raw.exists(keys.hash)
    raw.close()


def test_a_release_wakes_a_waiter_on_the_cluster(lock_client: LockClient) -> None:
    semaphore = lock_client.semaphore("wake", 1)
    assert semaphore.acquire(lease=30)
    granted_at: list[float] = []

    def waiter() -> None:
        assert semaphore.acquire(timeout=30)
        granted_at.append(time.monotonic())
        semaphore.release()

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.5)
    released_at = time.monotonic()
    semaphore.release()
    thread.join(40)
    assert granted_at and granted_at[0] - released_at < 5
