"""Deadlocks on a 3-master Redis Cluster: the locks and wait edges of one cycle on several nodes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from redis.cluster import RedisCluster

from django_rlock.core import DeadlockError, LockClient
from django_rlock.core._sync.sharding import slot_of
from tests.topologies.builders import Cluster

pytestmark = pytest.mark.slow

HANG = 30.0


@pytest.fixture
def lock_client(cluster: Cluster, raw: RedisCluster) -> Iterator[LockClient]:
    with LockClient(cluster.url, key_prefix="test", deadlock_timeout=0.5) as client:
        yield client


def test_a_ring_of_three_across_nodes_breaks_once(
    lock_client: LockClient, raw: RedisCluster
) -> None:
    names = ["ring:a", "ring:b", "ring:c"]
    slots = {slot_of(lock_client.lock(name).keys.hash) for name in names}
    owners = {raw.nodes_manager.get_node_from_slot(slot).name for slot in slots}
    assert len(slots) == 3
    barrier = threading.Barrier(3)
    outcomes: list[str] = []

    def member(first: str, second: str) -> None:
        with lock_client.lock(first):
            barrier.wait(HANG)
            try:
                with lock_client.lock(second):
                    outcomes.append("granted")
            except DeadlockError:
                outcomes.append("deadlock")

    threads = [
        threading.Thread(target=member, args=(names[i], names[(i + 1) % 3])) for i in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HANG)
        assert not thread.is_alive()
    assert sorted(outcomes) == ["deadlock", "granted", "granted"]
    assert len(owners) >= 2  # the walk crossed nodes
    assert not list(raw.scan_iter("test:waits:*", target_nodes=RedisCluster.ALL_NODES))


def test_a_cycle_of_a_read_write_lock_a_semaphore_and_a_fair_lock_across_nodes(
    lock_client: LockClient, raw: RedisCluster
) -> None:
    # Each kind's read covers one name's slot (its keys and the keys its
    # script builds from them); the search hops from node to node.
    rw = lock_client.read_write_lock("kinds:rw")
    semaphore = lock_client.semaphore("kinds:sem", 1)
    fair = lock_client.fair_lock("kinds:fair")
    pairs = [(rw.read, semaphore), (semaphore, fair), (fair, rw.write)]
    barrier = threading.Barrier(3)
    outcomes: list[str] = []

    def member(first: Any, second: Any) -> None:
        with first:
            barrier.wait(HANG)
            try:
                with second:
                    outcomes.append("granted")
            except DeadlockError:
                outcomes.append("deadlock")

    threads = [threading.Thread(target=member, args=pair) for pair in pairs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HANG)
        assert not thread.is_alive()
    assert sorted(outcomes) == ["deadlock", "granted", "granted"]
    slots = {slot_of(key) for key in (rw.write.keys.hash, semaphore.keys.hash, fair.keys.hash)}
    assert len({raw.nodes_manager.get_node_from_slot(slot).name for slot in slots}) >= 2
    assert not list(raw.scan_iter("test:waits:*", target_nodes=RedisCluster.ALL_NODES))
