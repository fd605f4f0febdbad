"""How soon queued waiters are woken after their lock's slot moved: a reshard, a failover.

Run with ``python -m benchmarks.cluster_wakeups`` (``--rounds 4``). Loopback
only: it builds its own Redis Cluster of 3 masters and 3 replicas
(tests/topologies/builders.py) from the suite's redis-server; Redis >= 7
announces releases with sharded pub/sub, which a slot's move drops (the case
measured), an older one with PUBLISH to every node. Each round, as in
tests/topologies/test_cluster_operations.py, a lock is held (its life: the
watchdog's 10 s) while four waiters queue for it (two threads of one client,
two clients alone); its slot then moves to another master by hand (``CLUSTER
SETSLOT``/``MIGRATE``, as ``redis-cli --cluster reshard`` does) or to its
replica (``CLUSTER FAILOVER TAKEOVER``), and the holder releases. A waiter's delay runs
from the release before its grant to that grant; one whose wake-up was lost
waits out most of the lock's life. The goal: every waiter within 100 ms.
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

from django_rlock.core._sync.sharding import slot_of
from tests.topologies.builders import Cluster
from tests.topologies.test_cluster_operations import (
    HELD_LOCK_LIFE,
    Queue,
    _failover,
    _move_slot_by_hand,
    _owner_of,
)

#: The goal: every waiter granted within this many seconds of the release before it.
GOAL = 0.100


def reshard(cluster: Cluster, slot: int) -> None:
    _move_slot_by_hand(cluster, slot, _owner_of(cluster, slot, cluster.nodes[0]))


def failover(cluster: Cluster, slot: int) -> None:
    _failover(cluster, slot, takeover=True)


def one_round(
    cluster: Cluster, name: str, kind: str, operation: Callable[..., None]
) -> list[float]:
    """Four waiters queued on ``name`` through ``operation``: each one's delay, in seconds."""
    with Queue(cluster.url, name, kind) as queue:
        operation(cluster, slot_of(queue.held.keys.hash))
        queue.release()
    if queue.errors or queue.overlaps:
        raise AssertionError(f"errors {queue.errors!r}, overlaps {queue.overlaps}")
    return queue.wake_latencies()


def row(label: str, rounds: list[list[float]]) -> str:
    delays = sorted(delay for result in rounds for delay in result)
    within = sum(delay <= GOAL for delay in delays)
    return (
        f"| {label} | {len(rounds)} | {within}/{len(delays)} "
        f"| {statistics.median(delays) * 1000:.1f} | {delays[-1] * 1000:.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    operations = {"reshard (slot moved by hand)": reshard, "failover (takeover)": failover}
    with Cluster(3, replicas=1) as cluster:
        version = cluster.nodes[0].client().info("server")["redis_version"]
        print(
            f"Redis {version} cluster, 3 masters + 3 replicas; 4 waiters per round, "
            f"lock life {HELD_LOCK_LIFE} s; delay from a release to the next grant\n"
        )
        print("| operation, lock | rounds | waiters within 100 ms | p50 ms | max ms |")
        print("|---|---|---|---|---|")
        for label, operation in operations.items():
            for kind in ("lock", "fair_lock"):
                rounds = [
                    one_round(cluster, f"bench-{kind}-{operation.__name__}-{n}", kind, operation)
                    for n in range(args.rounds)
                ]
                print(row(f"{label}, {kind}", rounds), flush=True)


if __name__ == "__main__":
    main()
