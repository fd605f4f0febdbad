"""A 3-master Redis Cluster: slots, sharded pub/sub, per-slot renewal, contention.

Sharded pub/sub needs Redis 7 (Valkey reports 7.2); on Redis 6.2 the engine
publishes with PUBLISH, which reaches every node.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest
import redis
from pytest_django.fixtures import Settings as SettingsWrapper
from redis.cluster import RedisCluster

from django_rlock.core import LockClient
from django_rlock.core._sync.connection import derive_client
from django_rlock.core._sync.sharding import ShardedReleaseListener, slot_of
from django_rlock.core._sync.watchdog import BATCH_SIZE, _batches, get_watchdog
from tests.topologies.builders import Cluster, wait_until
from tests.topologies.conftest import Renewals, held_locks

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sharded(cluster: Cluster) -> bool:
    """Whether the cluster's servers have sharded pub/sub (SSUBSCRIBE, Redis 7+)."""
    node = cluster.nodes[0].client()
    version = str(node.info("server")["redis_version"])
    node.close()
    return int(version.split(".", maxsplit=1)[0]) >= 7


@pytest.fixture
def lock_client(cluster: Cluster, raw: RedisCluster) -> Iterator[LockClient]:
    with LockClient(cluster.url, key_prefix="test", watchdog_timeout=3) as client:
        yield client


def test_a_cluster_url_gives_a_sharded_cluster_client(
    lock_client: LockClient, sharded: bool
) -> None:
    assert isinstance(lock_client.cluster, RedisCluster)
    assert lock_client.publish_command == ("spublish" if sharded else "publish")
    assert isinstance(lock_client.listener, ShardedReleaseListener) == sharded
    assert lock_client.slot_of is slot_of


@pytest.mark.parametrize("name", ["plain", "a{b}c", "{x}", "}{", "{", "}", "%7B", "{}{}"])
def test_every_name_keeps_its_keys_in_one_slot(
    lock_client: LockClient, raw: RedisCluster, name: str
) -> None:
    lock = lock_client.lock(name)
    keys = lock.keys
    assert len({slot_of(key) for key in (keys.hash, keys.fence, keys.waiters, keys.channel)}) == 1
    with lock:
        with lock:
            assert lock.hold_count() == 2
        assert raw.exists(keys.hash)
        assert lock.token is not None
    assert not raw.exists(keys.hash)
    assert lock_client.lock(name) is not lock  # a fresh object sees the same state
    assert not lock_client.lock(name).locked()


def test_a_waiter_uses_sharded_pubsub_on_the_slots_node(
    cluster: Cluster, lock_client: LockClient, raw: RedisCluster, sharded: bool
) -> None:
    if not sharded:
        pytest.skip("sharded pub/sub needs Redis 7 (the next test covers older servers)")
    lock = lock_client.lock("sharded")
    channel = lock.keys.channel.encode()
    owner_node = raw.get_node_from_key(lock.keys.hash)  # type: ignore[no-untyped-call]
    node_client = raw.get_redis_connection(owner_node)
    lock.acquire()
    got: list[float] = []

    def wait_for_it(other: LockClient) -> None:
        other_lock = other.lock("sharded")
        if other_lock.acquire(timeout=10):
            got.append(time.monotonic())
            other_lock.release()

    with LockClient(cluster.url, key_prefix="test", watchdog_timeout=3) as other_client:
        waiter = threading.Thread(target=wait_for_it, args=(other_client,))
        waiter.start()
        wait_until(
            lambda: channel in node_client.execute_command("PUBSUB", "SHARDCHANNELS"),  # type: ignore[no-untyped-call]
            5,
            "the waiter's SSUBSCRIBE on the node owning the slot",
        )
        # Its wake channel too, on the same node: the lock's slot.
        pattern = channel + b":&*"  # a wake-only name: never handed a lock (channels.py)
        assert node_client.execute_command("PUBSUB", "SHARDCHANNELS", pattern)  # type: ignore[no-untyped-call]
        for node in raw.get_primaries():  # type: ignore[no-untyped-call]
            node_raw = raw.get_redis_connection(node)
            assert channel not in node_raw.execute_command("PUBSUB", "CHANNELS")  # type: ignore[no-untyped-call]
        released = time.monotonic()
        lock.release()
        waiter.join(10)
        assert got, "the waiter did not get the lock"
        assert got[0] - released < 1.0  # woken by the SPUBLISH, not by the 3 s lease
        # One message, on the waiter's wake channel: its listener read it.
        assert other_client.listener.messages == 1
    wait_until(
        lambda: channel not in node_client.execute_command("PUBSUB", "SHARDCHANNELS"),  # type: ignore[no-untyped-call]
        5,
        "the waiter's SSUNSUBSCRIBE",
    )


def test_before_redis_7_a_waiter_is_woken_by_a_publish_on_any_node(
    cluster: Cluster, lock_client: LockClient, raw: RedisCluster, sharded: bool
) -> None:
    if sharded:
        pytest.skip("Redis 7+ clusters use sharded pub/sub (the test above)")
    lock = lock_client.lock("plain")
    channel = lock.keys.channel.encode()
    nodes = [raw.get_redis_connection(node) for node in raw.get_primaries()]  # type: ignore[no-untyped-call]

    def subscribed() -> bool:
        return any(channel in node.execute_command("PUBSUB", "CHANNELS") for node in nodes)  # type: ignore[no-untyped-call]

    lock.acquire()
    got: list[float] = []

    def wait_for_it(other: LockClient) -> None:
        other_lock = other.lock("plain")
        if other_lock.acquire(timeout=10):
            got.append(time.monotonic())
            other_lock.release()

    with LockClient(cluster.url, key_prefix="test", watchdog_timeout=3) as other_client:
        waiter = threading.Thread(target=wait_for_it, args=(other_client,))
        waiter.start()
        wait_until(subscribed, 5, "the waiter's SUBSCRIBE on one of the nodes")
        released = time.monotonic()
        lock.release()
        waiter.join(10)
        assert got, "the waiter did not get the lock"
        assert got[0] - released < 1.0  # woken by the PUBLISH, not by the 3 s lease
    wait_until(lambda: not subscribed(), 5, "the waiter's UNSUBSCRIBE")


def test_renewal_batches_never_mix_slots(cluster: Cluster, raw: RedisCluster) -> None:
    # The module's 3 s watchdog: a round is one pipeline per node, sent to the
    # nodes at once, so about 250 slots held fit its 1 s interval (sent one
    # slot after another, such a round once outlasted it beside CPU hogs).
    with LockClient(cluster.url, key_prefix="test", watchdog_timeout=3) as lock_client:
        locks = held_locks(lock_client, "renewed", 250)
        holds = lock_client.watched_holds()
        batches = _batches(holds, lock_client.slot_of)
        assert sum(len(batch) for batch in batches) == 250
        assert all(len({slot_of(hold.key) for hold in batch}) == 1 for batch in batches)
        assert all(len(batch) <= BATCH_SIZE for batch in batches)
        calls = get_watchdog().renewal_calls
        time.sleep(4)  # more than the 3 s timeout: only renewals keep them alive
        assert get_watchdog().renewal_calls > calls
        assert all(raw.exists(lock.keys.hash) for lock in locks)
        assert not any(lock.lost for lock in locks)
        for lock in locks:
            lock.release()


def _scripts_and_writes(node: redis.Redis) -> tuple[int, int]:
    """Scripts ``node`` ran and replies it wrote (``total_writes_processed``) since a reset.

    The server writes the replies of what one read brought in with one write:
    a pipeline costs a few (one per 16 KB of commands read), a call sent
    alone one.
    """
    commands = node.info("commandstats")
    scripts = sum(
        int(commands.get(name, {}).get("calls", 0)) for name in ("cmdstat_evalsha", "cmdstat_eval")
    )
    return scripts, int(node.info("stats")["total_writes_processed"])


def test_a_renewal_round_costs_a_round_trip_per_node_not_per_slot(
    cluster: Cluster, raw: RedisCluster
) -> None:
    count, timeout = 1500, 3.0
    with LockClient(cluster.url, key_prefix="test", watchdog_timeout=timeout) as lock_client:
        locks = held_locks(lock_client, "spread", count)
        acquired = time.monotonic()
        slots = {slot_of(lock.keys.hash) for lock in locks}
        assert len(slots) > 1300
        nodes = {node.name: raw.get_redis_connection(node) for node in raw.get_primaries()}  # type: ignore[no-untyped-call]
        slots_on = Counter(raw.nodes_manager.get_node_from_slot(slot).name for slot in slots)
        assert sorted(slots_on) == sorted(nodes)
        # One round has run (the scripts are loaded everywhere): statistics afresh.
        watchdog = get_watchdog()
        calls = watchdog.renewal_calls
        wait_until(lambda: watchdog.renewal_calls >= calls + len(slots), 30, "a renewal round")
        for node in nodes.values():
            node.config_resetstat()
        # Two whole rounds on every node, waited for (a loaded machine runs the
        # thread late); each look costs a node two replies.
        looks = 0
        deadline = time.monotonic() + 60
        while True:
            looks += 1
            seen = {name: _scripts_and_writes(node) for name, node in nodes.items()}
            if all(seen[name][0] >= 2 * slots_on[name] for name in nodes):
                break
            assert time.monotonic() < deadline, f"no two renewal rounds in 60 s: {seen}"
            time.sleep(0.5)
        for name, (scripts, writes) in seen.items():
            # One call per slot held on the node each round, in a few round
            # trips, not one per slot (which makes writes >= scripts). Besides
            # the rounds: the reset's reply, the looks', and a round the
            # window's edges cut.
            rounds = scripts / slots_on[name]
            assert writes - 1 - 2 * looks <= (rounds + 2) * 20, (name, scripts, writes, looks)
        # Every hold lives past its first key's life: each was renewed.
        time.sleep(max(acquired + timeout + 0.5 - time.monotonic(), 0))
        assert not any(lock.lost for lock in locks)
        assert all(raw.pttl(lock.keys.hash) > 0 for lock in locks)
        for lock in locks:
            lock.release()


@pytest.mark.faults
def test_a_paused_node_delays_no_other_nodes_renewals(cluster: Cluster, raw: RedisCluster) -> None:
    """One master stops answering (``CLIENT PAUSE``) for four renewal intervals.

    The nodes are sent to at once: each round, the paused node's batches fail
    after the renewal socket timeout (1 s here) while the others' are renewed
    ("ok", never "failed"), and none of theirs is lost. Sent one slot after
    another, each of the paused node's batches would wait out its own
    timeout, and the round would outlast the other holds' deadlines.
    """
    timeout, pause = 6.0, 8.0
    with (
        LockClient(cluster.url, key_prefix="test", watchdog_timeout=timeout) as lock_client,
        Renewals() as renewals,
    ):
        locks = held_locks(lock_client, "paused", 300)
        paused_node = raw.get_primaries()[0]  # type: ignore[no-untyped-call]
        on_paused = {
            lock.keys.hash
            for lock in locks
            if raw.get_node_from_key(lock.keys.hash).name == paused_node.name  # type: ignore[no-untyped-call]
        }
        assert 0 < len(on_paused) < len(locks)
        renewals.next_round(len(locks))  # the scripts are loaded everywhere
        seen = len(renewals.outcomes)
        raw.get_redis_connection(paused_node).execute_command(  # type: ignore[no-untyped-call]
            "CLIENT", "PAUSE", int(pause * 1000), "ALL"
        )
        time.sleep(pause - 1)  # three rounds meet the pause (2 s apart): two whole, at least
        others = Counter(
            outcome for hold, outcome in renewals.outcomes[seen:] if hold.key not in on_paused
        )
        paused = Counter(
            outcome for hold, outcome in renewals.outcomes[seen:] if hold.key in on_paused
        )
        assert set(others) == {"ok"}, others
        assert others["ok"] >= 2 * (len(locks) - len(on_paused)), others
        assert paused["failed"] > 0, paused  # the pause was met
        assert all(lock.keys.hash in on_paused for lock in locks if lock.lost)
        assert raw.get_redis_connection(paused_node).ping()  # answered once the pause ends


def _count_under_locks(
    url: str, seed: str, names: list[str], barrier: multiprocessing.synchronize.Barrier
) -> None:
    counters = RedisCluster.from_url(seed)
    with LockClient(url, key_prefix="test") as client:
        barrier.wait(30)
        for name in names:
            with client.lock(name):
                # A deliberately non-atomic read-modify-write: only the lock makes it safe.
                value = int(counters.get(f"count:{name}") or 0)
                counters.set(f"count:{name}", value + 1)
    counters.close()


def test_a_thousand_names_over_every_slot_contended_across_processes(
    cluster: Cluster, raw: RedisCluster
) -> None:
    names = [f"item:{index}" for index in range(1000)]
    slots = {slot_of(f"test:{{{name}}}") for name in names}
    assert len(slots) > 900
    nodes = {raw.get_node_from_key(f"test:{{{name}}}").name for name in names}  # type: ignore[no-untyped-call]
    assert len(nodes) == 3
    processes = 3
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(processes)
    # Every process takes the names in the same order, so they collide on each one.
    workers = [
        context.Process(
            target=_count_under_locks,
            args=(cluster.url, f"redis://127.0.0.1:{cluster.nodes[0].port}", names, barrier),
        )
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=90)
    assert [worker.exitcode for worker in workers] == [0] * processes
    counts = [int(raw.get(f"count:{name}") or 0) for name in names]
    assert counts == [processes] * len(names)  # 0 lost updates
    assert not any(raw.exists(f"test:{{{name}}}") for name in names[:50])


def test_django_rlocks_location_for_a_cluster(
    cluster: Cluster, raw: RedisCluster, settings: SettingsWrapper, sharded: bool
) -> None:
    from django_rlock import locks  # noqa: PLC0415 -- needs Django settings

    settings.RLOCKS = {"default": {"LOCATION": cluster.url, "KEY_PREFIX": "test"}}
    backend = locks["default"]
    try:
        with backend.lock("django:{1}") as lock:
            assert raw.exists(lock.keys.hash)
            expected = "spublish" if sharded else "publish"
            assert backend.client.publish_command == expected  # type: ignore[attr-defined]
        assert not raw.exists(lock.keys.hash)
    finally:
        backend.close()


def test_a_derived_cluster_client_sends_a_call_once(cluster: Cluster, raw: RedisCluster) -> None:
    """A client the engine derives (renewals, the listener's) never resends a call itself.

    Its node stops answering (``CLIENT PAUSE``) for longer than the derived
    client's socket timeout: the call fails at that timeout, once. A hidden
    retry (redis-py before 6 retries a cluster call 3 more times by default,
    whatever its ``retry``) sends it again on a new connection each time (the
    one that timed out is closed, and the call it carried dropped with it),
    taking four timeouts where the engine budgets one.
    """
    key = "derived:sent-once"
    user_client = cluster.client()  # redis-py's defaults, retries included
    derived = derive_client(user_client, socket_timeout=0.3, socket_connect_timeout=0.3)
    node = raw.get_redis_connection(raw.get_node_from_key(key))  # type: ignore[no-untyped-call]
    try:
        derived.ping()  # the derived client knows the cluster before the pause
        connections = int(node.info("stats")["total_connections_received"])
        node.execute_command("CLIENT", "PAUSE", 3000, "ALL")  # type: ignore[no-untyped-call]
        with pytest.raises(redis.TimeoutError):
            derived.incr(key)
        assert node.ping()  # answered once the pause has ended
        made = int(node.info("stats")["total_connections_received"]) - connections
        assert made <= 1
    finally:
        derived.close()
        user_client.close()
