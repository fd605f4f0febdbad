"""Deadlock detection, measured per lock kind: how fast a cycle breaks, what a wait pays.

``python -m benchmarks.deadlocks`` (``--runs 7``). Loopback only: it starts
its own redis-server (tests/servers.py). Three tables:

1. **Detection delay**: two threads close a cycle through each kind; the time
   from the victim's acquire call to its ``DeadlockError``
   (``deadlock_timeout=0.2``).
2. **A waiter's extra cost**: one waiter behind holders that run (no cycle)
   for 2 s with ``deadlock_timeout=0.1``: its checks, the commands each check
   sends (round trips: the first writes the edge, the later ones renew it),
   and each check's time. Plus one DEL when the wait ends.
3. **The uncontended path**: acquire + release with detection on (1 s) and
   off, in alternating blocks on one client: the ratio should be 1.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import redis

from django_rlock.core import DeadlockError, LockClient
from django_rlock.core._sync.locks import RLock
from tests.servers import RedisServer

Take = Callable[[LockClient], AbstractContextManager[Any]]

#: How long a test thread may take before the benchmark calls it hung.
HANG = 30.0


# -- 1. detection delay ------------------------------------------------------------------


def cycle_once(client: LockClient, first: tuple[Take, Take], second: tuple[Take, Take]) -> float:
    """Two threads each take their first, then their second; the victim's wait (seconds)."""
    barrier = threading.Barrier(2)
    waited: list[float] = []

    def member(pair: tuple[Take, Take], delay: float) -> None:
        with pair[0](client):
            barrier.wait(HANG)
            time.sleep(delay)  # the second member closes the cycle: it is the victim
            began = time.monotonic()
            try:
                with pair[1](client):
                    pass
            except DeadlockError:
                waited.append(time.monotonic() - began)

    threads = [
        threading.Thread(target=member, args=(first, 0.0)),
        threading.Thread(target=member, args=(second, 0.05)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HANG)
    if len(waited) != 1:
        raise RuntimeError(f"expected one victim, got {len(waited)}")
    return waited[0]


CYCLES: dict[str, tuple[tuple[Take, Take], tuple[Take, Take]]] = {
    "lock, lock": (
        (lambda c: c.lock("a"), lambda c: c.lock("b")),
        (lambda c: c.lock("b"), lambda c: c.lock("a")),
    ),
    "fair lock, fair lock": (
        (lambda c: c.fair_lock("a"), lambda c: c.fair_lock("b")),
        (lambda c: c.fair_lock("b"), lambda c: c.fair_lock("a")),
    ),
    "lock, writer waiting for a reader": (
        (lambda c: c.read_write_lock("rw").read, lambda c: c.lock("a")),
        (lambda c: c.lock("a"), lambda c: c.read_write_lock("rw").write),
    ),
    "lock, reader waiting for a writer": (
        (lambda c: c.read_write_lock("rw").write, lambda c: c.lock("a")),
        (lambda c: c.lock("a"), lambda c: c.read_write_lock("rw").read),
    ),
    "lock, semaphore of 1": (
        (lambda c: c.semaphore("s", 1), lambda c: c.lock("a")),
        (lambda c: c.lock("a"), lambda c: c.semaphore("s", 1)),
    ),
}


def detection(url: str, runs: int) -> None:
    print("| cycle through | median ms | min ms | max ms |")
    print("|---|---|---|---|")
    with LockClient(url, key_prefix="bench", deadlock_timeout=0.2) as client:
        for label, (first, second) in CYCLES.items():
            seconds = [cycle_once(client, first, second) for _ in range(runs)]
            print(
                f"| {label} | {statistics.median(seconds) * 1000:.0f} "
                f"| {min(seconds) * 1000:.0f} | {max(seconds) * 1000:.0f} |",
                flush=True,
            )
    with LockClient(url, key_prefix="bench", layout="redisson", deadlock_timeout=0.2) as client:
        seconds = [
            cycle_once(
                client,
                (lambda c: c.lock("ra"), lambda c: c.lock("rb")),
                (lambda c: c.lock("rb"), lambda c: c.lock("ra")),
            )
            for _ in range(runs)
        ]
        print(
            f"| lock, lock (layout='redisson') | {statistics.median(seconds) * 1000:.0f} "
            f"| {min(seconds) * 1000:.0f} | {max(seconds) * 1000:.0f} |",
            flush=True,
        )


# -- 2. a waiter's extra cost --------------------------------------------------------------

#: Each check of the waiting thread: (seconds, commands sent), gathered by the hooks below.
_checks: list[tuple[float, int]] = []

_counting = threading.local()


@contextmanager
def measured_checks() -> Iterator[list[tuple[float, int]]]:
    """Time the waiting (main) thread's deadlock checks and count the commands each sends.

    Measurement hooks around the engine's own methods, not a change to them:
    every command a check sends goes through ``redis.Redis.execute_command``.
    """
    check = RLock._check_deadlock
    execute: Callable[..., Any] = redis.Redis.execute_command
    waiting = threading.current_thread()

    def measured(self: RLock, detector: Any, started: float) -> None:
        if threading.current_thread() is not waiting:
            check(self, detector, started)
            return
        _counting.sent = 0
        began = time.perf_counter()
        try:
            check(self, detector, started)
        finally:
            _checks.append((time.perf_counter() - began, _counting.sent))
            _counting.sent = None

    def counted(self: redis.Redis, *args: Any, **options: Any) -> Any:
        if getattr(_counting, "sent", None) is not None:
            _counting.sent += 1
        return execute(self, *args, **options)

    _checks.clear()
    RLock._check_deadlock = measured  # type: ignore[method-assign]
    redis.Redis.execute_command = counted  # type: ignore[method-assign]
    try:
        yield _checks
    finally:
        RLock._check_deadlock = check  # type: ignore[method-assign]
        redis.Redis.execute_command = execute  # type: ignore[method-assign]


def _chain(length: int) -> list[tuple[Take, Take]]:
    def pair(i: int) -> tuple[Take, Take]:
        return (lambda c: c.lock(f"chain:{i}"), lambda c: c.lock(f"chain:{i + 1}"))

    return [pair(i) for i in range(1, length)]


#: A scenario: (holders' takes, a chain of waiters, the waiter's take). Holders
#: take theirs and hold it for the wait; a chain member holds its first and
#: waits for its second; the waiter waits for the first.
Scenario = tuple[list[Take], list[tuple[Take, Take]], Take]

WAITS: dict[str, Scenario] = {
    "lock behind a running holder": ([lambda c: c.lock("w")], [], lambda c: c.lock("w")),
    "fair lock behind a running holder": (
        [lambda c: c.fair_lock("w")],
        [],
        lambda c: c.fair_lock("w"),
    ),
    "writer behind 4 running readers": (
        [lambda c: c.read_write_lock("w").read] * 4,
        [],
        lambda c: c.read_write_lock("w").write,
    ),
    "reader behind a running writer": (
        [lambda c: c.read_write_lock("w").write],
        [],
        lambda c: c.read_write_lock("w").read,
    ),
    "semaphore of 4 behind 4 running holders": (
        [lambda c: c.semaphore("w", 4)] * 4,
        [],
        lambda c: c.semaphore("w", 4),
    ),
    "lock behind a chain of 4 locks (3 waiting owners)": (
        [lambda c: c.lock("chain:4")],
        _chain(4),
        lambda c: c.lock("chain:1"),
    ),
}


def one_wait(url: str, scenario: Scenario, every: float, hold: float) -> list[tuple[float, int]]:
    """Run the scenario; the waiter's checks."""
    holders, chain, waiter = scenario
    with LockClient(url, key_prefix="bench", deadlock_timeout=every) as client:
        all_held = threading.Barrier(len(holders) + len(chain) + 1)
        release = threading.Event()

        def holder(take: Take) -> None:
            with take(client):
                all_held.wait(HANG)
                release.wait(HANG)

        def link(pair: tuple[Take, Take]) -> None:
            with pair[0](client):
                all_held.wait(HANG)
                with pair[1](client):
                    pass

        threads = [threading.Thread(target=holder, args=(take,)) for take in holders]
        threads += [threading.Thread(target=link, args=(pair,)) for pair in chain]
        for thread in threads:
            thread.start()
        all_held.wait(HANG)
        time.sleep(0.2)  # the chain's members are waiting
        timer = threading.Timer(hold, release.set)
        with measured_checks() as checks:
            timer.start()
            with waiter(client):
                pass
            found = list(checks)
        for thread in threads:
            thread.join(HANG)
    return found


def costs(url: str) -> None:
    every, hold = 0.1, 2.0
    print(
        f"| waiter (held {hold:g} s, deadlock_timeout {every:g} s) | checks "
        "| commands per check (first, then) | check median ms | check max ms |"
    )
    print("|---|---|---|---|---|")
    for label, scenario in WAITS.items():
        checks = one_wait(url, scenario, every, hold)
        times = [seconds for seconds, _ in checks]
        sent = [count for _, count in checks]
        later = statistics.median(sent[1:]) if len(sent) > 1 else 0
        print(
            f"| {label} | {len(checks)} | {sent[0]}, then {later:g} "
            f"| {statistics.median(times) * 1000:.2f} | {max(times) * 1000:.2f} |",
            flush=True,
        )


# -- 3. the uncontended path ---------------------------------------------------------------

UNCONTENDED: dict[str, Take] = {
    "lock": lambda c: c.lock("u"),
    "fair lock": lambda c: c.fair_lock("u"),
    "write lock": lambda c: c.read_write_lock("u").write,
    "semaphore": lambda c: c.semaphore("u", 2),
}


def uncontended(url: str, blocks: int, per_block: int) -> None:
    print("| kind | detection off µs/cycle | on (1 s) µs/cycle | on / off |")
    print("|---|---|---|---|")
    with (
        LockClient(url, key_prefix="bench", deadlock_timeout=None) as off_client,
        LockClient(url, key_prefix="bench", deadlock_timeout=1.0) as on_client,
    ):
        for label, take in UNCONTENDED.items():
            timings: dict[str, list[float]] = {"off": [], "on": []}
            locks = {"off": take(off_client), "on": take(on_client)}
            for _ in range(blocks):
                for mode in ("off", "on"):
                    lock = locks[mode]
                    began = time.perf_counter()
                    for _ in range(per_block):
                        with lock:
                            pass
                    timings[mode].append((time.perf_counter() - began) / per_block)
            off = statistics.median(timings["off"]) * 1e6
            on = statistics.median(timings["on"]) * 1e6
            print(f"| {label} | {off:.0f} | {on:.0f} | {on / off:.2f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--per-block", type=int, default=300)
    args = parser.parse_args()
    with RedisServer() as server:
        r = server.client()
        print("Detection delay (deadlock_timeout 0.2 s), the victim's wait:\n")
        detection(server.url, args.runs)
        print("\nA waiter's extra cost (no cycle):\n")
        costs(server.url)
        print("\nThe uncontended path, acquire + release:\n")
        uncontended(server.url, args.blocks, args.per_block)
        r.close()


if __name__ == "__main__":
    main()
