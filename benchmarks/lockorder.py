"""What the lock order check costs: check on / check off, paired, for one lock and for two nested.

``python -m benchmarks.lockorder`` runs blocks of acquire+release cycles on two
clients of one redis-server, one with ``lock_order_check=True``, back to back
with the order alternating, and prints the median of the per-pair ratios (on /
off, cycles per second: below 1 is the check's cost), beside the same ratio for
two clients both off (the noise). Off, the check subscribes
nothing, so the off client's path is the engine's ordinary one. On a loaded
machine a cycle's noise is larger than the check, so it also times the check's
own work per new hold (what runs on each grant: the call site, the owner's
other holds, the graph) with one other lock held, in microseconds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from django_rlock.core import LockClient
from django_rlock.core._process.lockorder import lock_order
from tests.servers import RedisServer


def one_lock(client: LockClient, cycles: int) -> float:
    """Cycles per second of ``with lock:`` on one lock."""
    lock = client.lock("bench:one")
    started = time.perf_counter()
    for _ in range(cycles):
        with lock:
            pass
    return cycles / (time.perf_counter() - started)


def two_nested(client: LockClient, cycles: int) -> float:
    """Cycles per second of two nested locks (the check's edge lookup on every inner grant)."""
    outer, inner = client.lock("bench:outer"), client.lock("bench:inner")
    started = time.perf_counter()
    for _ in range(cycles):
        with outer, inner:
            pass
    return cycles / (time.perf_counter() - started)


def check_cost(client: LockClient, calls: int) -> float:
    """Microseconds the check spends on one new hold while its owner holds one other lock."""
    outer, inner = client.lock("bench:cost-outer"), client.lock("bench:cost-inner")
    with outer, inner:
        hold = client.holds.holds_owned_by(client.holds.watched_holds()[0].owner)[-1]
        started = time.perf_counter()
        for _ in range(calls):
            lock_order.acquired(hold)
        return (time.perf_counter() - started) / calls * 1e6


def ratio(
    block: Callable[[LockClient, int], float],
    on: LockClient,
    off: LockClient,
    pairs: int,
    cycles: int,
) -> tuple[float, float, float]:
    """Median of on/off ratios over ``pairs`` pairs, and each side's median rate."""
    block(on, 50)
    block(off, 50)
    ratios, rates_on, rates_off = [], [], []
    for index in range(pairs):
        clients = (on, off) if index % 2 == 0 else (off, on)
        rates = {id(client): block(client, cycles) for client in clients}
        rates_on.append(rates[id(on)])
        rates_off.append(rates[id(off)])
        ratios.append(rates[id(on)] / rates[id(off)])
    return statistics.median(ratios), statistics.median(rates_on), statistics.median(rates_off)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--cycles", type=int, default=400)
    args = parser.parse_args()
    with RedisServer() as server:
        on = LockClient(server.url, key_prefix="on", lock_order_check=True)
        off = LockClient(server.url, key_prefix="off")
        # The control: two clients both off. Its distance from 1 is the noise.
        control = LockClient(server.url, key_prefix="control")
        print("| block | on / off | off / off (control) | on (cycles/s) | off (cycles/s) |")
        print("|---|---|---|---|---|")
        for name, block in (("one lock", one_lock), ("two nested", two_nested)):
            median, rate_on, rate_off = ratio(block, on, off, args.pairs, args.cycles)
            noise = ratio(block, control, off, args.pairs, args.cycles)[0]
            print(f"| {name} | {median:.3f}x | {noise:.3f}x | {rate_on:.0f} | {rate_off:.0f} |")
        print(f"\ncheck's own work per new hold: {check_cost(on, 5000):.1f} us")
        for client in (on, off, control):
            client.close()


if __name__ == "__main__":
    main()
