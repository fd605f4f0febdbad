"""What fairness costs: a fair lock beside a plain lock, on one redis-server.

Two figures per kind, in interleaved rounds (the order alternates, so drift of
a noisy machine hits both alike), reported as medians and as fair/plain ratios:

* wake-up p50: from the holder's release to the one waiter holding the lock;
* 4-thread contended throughput: acquire+release cycles per second, and the
  spread between the busiest and the least busy thread (fairness shows there).

Run with ``python -m benchmarks.fairlock [--rounds N] [--seconds S]``.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from django_rlock.core import LockClient
from tests.servers import RedisServer

MakeLock = Callable[[str], Any]


def wake_up_p50(make: MakeLock, samples: int) -> float:
    """Median seconds from a release to its one waiter holding the lock."""
    lock = make("wake")

    def waiter(waiting: threading.Event, held_at: list[float]) -> None:
        waiting.set()
        lock.acquire()
        held_at.append(time.perf_counter())
        lock.release()

    latencies = []
    for _ in range(samples):
        lock.acquire()
        waiting = threading.Event()
        held_at: list[float] = []
        thread = threading.Thread(target=waiter, args=(waiting, held_at))
        thread.start()
        waiting.wait()
        time.sleep(0.005)  # the waiter is asleep on the channel
        released = time.perf_counter()
        lock.release()
        thread.join()
        latencies.append(held_at[0] - released)
    return statistics.median(latencies)


def contended(make: MakeLock, threads: int, seconds: float) -> tuple[float, float]:
    """Cycles per second of ``threads`` threads on one lock, and max/min cycles per thread."""
    lock = make("contended")
    counts: list[int] = []
    stop = time.monotonic() + seconds

    def worker() -> None:
        cycles = 0
        while time.monotonic() < stop:
            with lock:
                cycles += 1
        counts.append(cycles)

    workers = [threading.Thread(target=worker) for _ in range(threads)]
    started = time.monotonic()
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    return sum(counts) / (time.monotonic() - started), max(counts) / max(min(counts), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--samples", type=int, default=300)
    options = parser.parse_args()
    results: dict[str, dict[str, list[float]]] = {
        kind: {"wake": [], "rate": [], "spread": []} for kind in ("plain", "fair")
    }
    with RedisServer() as server, LockClient(server.url, key_prefix="bench") as client:
        kinds: dict[str, MakeLock] = {"plain": client.lock, "fair": client.fair_lock}
        for round_index in range(options.rounds):
            order = ["plain", "fair"] if round_index % 2 == 0 else ["fair", "plain"]
            for kind in order:
                wake = wake_up_p50(kinds[kind], options.samples)
                rate, spread = contended(kinds[kind], 4, options.seconds)
                for figure, value in (("wake", wake), ("rate", rate), ("spread", spread)):
                    results[kind][figure].append(value)
                print(
                    f"round {round_index} {kind:5}: wake-up p50 {wake * 1000:.2f} ms, "
                    f"4 threads {rate:.0f} cycles/s, busiest/least busy {spread:.2f}",
                    flush=True,
                )
    plain, fair = results["plain"], results["fair"]
    print(
        f"median: wake-up p50 plain {statistics.median(plain['wake']) * 1000:.2f} ms, "
        f"fair {statistics.median(fair['wake']) * 1000:.2f} ms; "
        f"4 threads plain {statistics.median(plain['rate']):.0f}/s, "
        f"fair {statistics.median(fair['rate']):.0f}/s "
        f"(fair/plain {statistics.median(fair['rate']) / statistics.median(plain['rate']):.2f}); "
        f"spread plain {statistics.median(plain['spread']):.2f}, "
        f"fair {statistics.median(fair['spread']):.2f}"
    )


if __name__ == "__main__":
    main()
