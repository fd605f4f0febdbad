"""A semaphore on a 3-master Redis Cluster: its keys in one slot, waking, renewal."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from redis.cluster import RedisCluster

from django_rlock.core import LockClient
from django_rlock.core._process.identity import thread_owner
from django_rlock.core._protocol.semaphore import permit_key
from django_rlock.core._sync.sharding import slot_of
from tests.topologies.builders import Cluster
from tests.waking import seconds_to_wake

pytestmark = pytest.mark.slow


@pytest.fixture
def lock_client(cluster: Cluster, raw: RedisCluster) -> Iterator[LockClient]:
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
    assert seconds_to_wake(semaphore, settle=0.5) < 5
