"""A renewal round on a Redis Cluster: one EVAL per slot in series, against one pipeline per node.

Run with ``python -m benchmarks.cluster_renewal`` (``--holds 500 2000 5000``,
``--rounds 7``). Loopback only: it builds its own 3-master Redis Cluster
(tests/topologies/builders.py) from the suite's redis-server, holds that many
locks (their names spread over the slots), and times one renewal round of
every hold two ways, alternating, in one process:

* ``per slot``: each slot's batch sent alone by ``LockClient.renew_batch``,
  one after another: the watchdog's round before renewals were grouped by node;
* ``per node``: ``LockClient.renew_batches``, each node's batches as one
  pipeline, the nodes at once: the watchdog's round now.

The client's watchdog timeout is long (300 s), so that its own thread renews
nothing meanwhile. Prints a markdown table: the median wall time of a round
each way, their ratio, and the share of the default watchdog's 10 s interval
a round takes.
"""

from __future__ import annotations

import argparse
import statistics
import time

from django_rlock.core import LockClient
from django_rlock.core._sync.watchdog import _batches
from django_rlock.core.defaults import DEFAULT_WATCHDOG_TIMEOUT, renewal_interval
from tests.topologies.builders import Cluster


def measure(cluster: Cluster, holds: int, rounds: int) -> tuple[int, list[float], list[float]]:
    """Slots held, and the wall times of ``rounds`` rounds each way (per slot, per node)."""
    with LockClient(cluster.url, key_prefix="bench", watchdog_timeout=300) as client:
        locks = [client.lock(f"renewal:{index}") for index in range(holds)]
        for lock in locks:
            lock.acquire()
        batches = _batches(client.watched_holds(), client.slot_of)
        client.renew_batches(batches)  # the scripts loaded on every node
        per_slot: list[float] = []
        per_node: list[float] = []
        for turn in range(2 * rounds):
            started = time.perf_counter()
            if turn % 2 == 0:
                for batch in batches:
                    client.renew_batch(batch)
                per_slot.append(time.perf_counter() - started)
            else:
                replies = client.renew_batches(batches)
                per_node.append(time.perf_counter() - started)
                failed = [reply for reply in replies if isinstance(reply, Exception)]
                if failed:
                    raise AssertionError(f"{len(failed)} batches failed: {failed[0]!r}")
        for lock in locks:
            lock.release()
    return len(batches), per_slot, per_node


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--holds", type=int, nargs="+", default=[500, 2000, 5000])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    interval = renewal_interval(DEFAULT_WATCHDOG_TIMEOUT)
    print("| holds | slots held | per slot, in series | per node, at once | ratio | of 10 s |")
    print("|---:|---:|---:|---:|---:|---:|")
    with Cluster(3) as cluster:
        for holds in args.holds:
            slots, per_slot, per_node = measure(cluster, holds, args.rounds)
            slow, fast = statistics.median(per_slot), statistics.median(per_node)
            print(
                f"| {holds:,} | {slots:,} | {slow * 1000:.1f} ms | {fast * 1000:.1f} ms "
                f"| **{slow / fast:.1f}x** | {slow / interval:.1%} -> {fast / interval:.2%} |"
            )


if __name__ == "__main__":
    main()
