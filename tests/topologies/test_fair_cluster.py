"""Fair locks on a 3-master Redis Cluster: one slot per name, the head woken by (S)PUBLISH.

On Redis 7 the waiters listen with sharded pub/sub, one listener per node: a
fair waiter's queue id is taken before it knows its node
(``ShardedReleaseListener.new_waiter_id``) and must still name it there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from redis.cluster import RedisCluster

from django_rlock.core import LockClient
from django_rlock.core._sync.sharding import slot_of
from tests.topologies.builders import Cluster, wait_until

pytestmark = pytest.mark.slow

HANG = 15.0  # seconds: only reached when something hangs

#: Longer than the test runs: a waiter not woken by its message would sleep past HANG.
LONG = 60.0


@pytest.fixture
def lock_client(cluster: Cluster, raw: RedisCluster) -> Iterator[LockClient]:
    with LockClient(cluster.url, key_prefix="fair", watchdog_timeout=LONG) as client:
        yield client


def _queued(raw: RedisCluster, queue: str, count: int) -> Callable[[], bool]:
    return lambda: raw.zcard(queue) == count


@pytest.mark.parametrize("name", ["plain", "a{b}c", "{x}", "}{", "%7B"])
def test_every_fair_key_of_a_name_is_in_one_slot(lock_client: LockClient, name: str) -> None:
    keys = lock_client.fair_lock(name).fair_keys
    every = (keys.hash, keys.fence, keys.waiters, keys.queue, keys.channel, keys.latch("o"))
    assert len({slot_of(key) for key in every}) == 1


def test_waiters_are_woken_in_arrival_order_on_a_cluster(
    lock_client: LockClient, raw: RedisCluster
) -> None:
    lock = lock_client.fair_lock("report")
    assert lock.acquire(lease=LONG)
    history: list[int] = []

    def waiter(index: int) -> None:
        if lock.acquire(timeout=LONG - index):
            history.append(index)
            lock.release()

    threads = []
    for index in range(4):
        thread = threading.Thread(target=waiter, args=(index,), daemon=True)
        thread.start()
        threads.append(thread)
        wait_until(_queued(raw, lock.fair_keys.queue, index + 1), HANG, "queued")
    started = time.monotonic()
    lock.release()
    for thread in threads:
        thread.join(max(HANG - (time.monotonic() - started), 0.1))
    assert history == [0, 1, 2, 3]
