"""``layout="redisson"`` on a 3-master Redis Cluster, beside Redisson's RLock.

Redisson sends each command to the node owning its keys' slot; every key of a
shared lock is in the name's slot, so the emulated Java instance here talks to
that node. On Redis >= 7 both sides announce releases with SPUBLISH (Redisson's
``ShardedSubscriptionMode.AUTO`` and ``sharded_subscription="auto"``), before
with PUBLISH, which reaches every node.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from redis.cluster import RedisCluster

from django_rlock.core import LockClient
from tests.interop.conftest import JavaSide, server_major
from tests.topologies.builders import Cluster, Unavailable

pytestmark = pytest.mark.slow

WOKEN = 2.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    topology = Cluster(3)
    try:
        topology.__enter__()
    except Unavailable as missing:
        pytest.skip(str(missing))
    try:
        yield topology
    finally:
        topology.__exit__()


@pytest.fixture
def raw(cluster: Cluster) -> Iterator[RedisCluster]:
    client = cluster.client()
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def java_on(emu: Any, raw: RedisCluster) -> Iterator[Any]:
    """``java_on(name)``: a Redisson instance on the node owning ``name``'s slot."""
    node = raw.get_node_from_key("x")  # type: ignore[no-untyped-call]
    sharded = server_major(raw.get_redis_connection(node)) >= 7
    side = JavaSide(emu, "")

    def make(name: str) -> Any:
        owner = raw.get_node_from_key(name)  # type: ignore[no-untyped-call]
        url = f"redis://{owner.host}:{owner.port}/0"
        return side(url=url, publish_command="spublish" if sharded else "publish")

    yield make
    undecodable = side.close()
    assert not undecodable, f"Redisson could not decode: {undecodable}"


@pytest.mark.parametrize("name", ["order:42", "{order}:42"])
def test_a_lock_is_shared_on_a_cluster(
    cluster: Cluster, raw: RedisCluster, java_on: Any, emu: Any, name: str
) -> None:
    jvm = java_on(name)
    java, fenced = jvm.get_lock(name), jvm.get_fenced_lock(name)
    with (
        LockClient(cluster.url, layout="redisson", watchdog_timeout=3) as client,
        ThreadPoolExecutor(1) as java_thread,
    ):
        assert client.publish_command == jvm.config.publish_command
        lock = client.lock(name)
        # Exclusion both ways, and every key of both sides in the name's slot.
        assert lock.acquire(lease=20)
        assert java_thread.submit(java.is_locked).result()
        assert not java_thread.submit(java.try_lock_once).result()
        keys = raw.keys("*", target_nodes="all")
        slots = {emu.calc_slot(key.decode() if isinstance(key, bytes) else key) for key in keys}
        assert slots == {emu.calc_slot(name)}
        # A Python release wakes a Java waiter (tryLock(8 s, 20 s lease)).
        waiter = java_thread.submit(java.try_lock, 8000, 20000)
        time.sleep(0.3)
        released = time.monotonic()
        lock.release()
        assert waiter.result(10) and time.monotonic() - released < WOKEN
        # A Java release wakes a Python waiter.
        woken: dict[str, Any] = {}

        def wait() -> None:
            woken["granted"] = lock.acquire(timeout=8)
            woken["at"] = time.monotonic()
            if woken["granted"]:
                lock.release()

        python_waiter = threading.Thread(target=wait)
        python_waiter.start()
        time.sleep(0.3)
        released = time.monotonic()
        java_thread.submit(java.unlock).result()
        python_waiter.join(10)
        assert woken["granted"] and woken["at"] - released < WOKEN
        # One token sequence with RFencedLock.
        first = java_thread.submit(fenced.try_lock_and_get_token, 1000, 5000).result()
        java_thread.submit(fenced.unlock).result()
        with lock:
            second = lock.token
        third = java_thread.submit(fenced.try_lock_and_get_token, 1000, 5000).result()
        # And a Python force-release of the Java hold.
        assert first < second < third and lock.force_release()
        assert not java_thread.submit(java.is_locked).result()


def test_mixed_contention_on_a_cluster(cluster: Cluster, raw: RedisCluster, java_on: Any) -> None:
    rounds, state = 10, {"counter": 0, "inside": 0, "overlaps": 0}
    guard = threading.Lock()
    jvm = java_on("tally")

    def critical() -> None:
        with guard:
            state["inside"] += 1
            state["overlaps"] += state["inside"] > 1
        value = state["counter"]
        time.sleep(0.002)
        state["counter"] = value + 1
        with guard:
            state["inside"] -= 1

    with LockClient(cluster.url, layout="redisson", watchdog_timeout=3) as client:

        def python_side() -> None:
            lock = client.lock("tally")
            for _ in range(rounds):
                assert lock.acquire(timeout=20)
                try:
                    critical()
                finally:
                    lock.release()

        def java_side() -> None:
            java = jvm.get_lock("tally")
            for _ in range(rounds):
                java.lock()
                try:
                    critical()
                finally:
                    java.unlock()

        threads = [threading.Thread(target=side) for side in [python_side, java_side] * 2]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    assert state == {"counter": 4 * rounds, "inside": 0, "overlaps": 0}
