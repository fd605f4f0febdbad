"""Bounded soak: many processes contend on many locks while faults are injected at random.

Run with ``make soak`` (``SOAK_ARGS="--seconds 60"`` to shorten it) or
``python -m benchmarks.soak``. Loopback only: it starts its own redis-server,
puts one :class:`~tests.faults.proxy.FaultProxy` in front of it per worker
process, and stops by itself after ``--seconds`` (default 5 minutes).

Faults, one at a time at random intervals: a partition of one worker (its
proxy blackholed for up to twice the watchdog timeout), a server stall
(``CLIENT PAUSE`` or ``DEBUG SLEEP`` for up to twice the timeout), and
pub/sub loss (every subscriber connection killed).

Mutual exclusion is checked outside Redis, in shared memory: a worker marks a
lock's slot with its fencing token on entry and clears it on leaving, or the
moment it is told the lock was lost (``on_lost``). Finding a slot already
marked on entry is a violation: two owners that both believed they held the
lock. No worker is ever paused, so there must be none. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import queue
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from multiprocessing.sharedctypes import SynchronizedArray
from multiprocessing.synchronize import Event, Lock
from typing import Any

import redis

from django_rlock.core import LockClient, LockError, LockLostError, RLock
from django_rlock.core._sync.watchdog import get_watchdog
from tests.faults.conftest import server_major
from tests.faults.proxy import FaultProxy
from tests.servers import RedisServer

#: Longest single call a worker makes (no client retries: URL-built clients have none).
SOCKET_TIMEOUT = 1.0


def worker(
    number: int,
    url: str,
    *,
    args: argparse.Namespace,
    slots: SynchronizedArray[int],
    slots_lock: Lock,
    stop: Event,
    results: multiprocessing.Queue[dict[str, Any]],
) -> None:
    """Acquire random locks until ``stop``; report counters on ``results``."""
    rng = random.Random(args.seed * 1000 + number)
    if not args.verbose:
        # Every fault logs a warning per process; the table tells the story.
        logging.getLogger("django_rlock").setLevel(logging.ERROR)
    stats: Counter[str] = Counter()
    client = LockClient(
        f"{url}?socket_timeout={SOCKET_TIMEOUT}&socket_connect_timeout={SOCKET_TIMEOUT}",
        key_prefix="soak",
        watchdog_timeout=args.timeout,
    )
    client.on_lost(lambda _lock: stats.update(["lost"]))

    def leave(index: int, token: int) -> None:
        with slots_lock:
            if slots[index] == token:
                slots[index] = 0

    while not stop.is_set():
        index = rng.randrange(args.names)
        lock: RLock = client.lock(f"n{index}")
        try:
            if not lock.acquire(timeout=2.0):
                stats["timeouts"] += 1
                continue
        except (redis.RedisError, LockError):
            stats["acquire_errors"] += 1
            continue
        token = lock.token or -1
        stats["acquisitions"] += 1
        with slots_lock:
            if slots[index] != 0:
                stats["violations"] += 1
            slots[index] = token
        lock.on_lost(_leaving(leave, index, token))
        # Mostly short work; one hold in 20 outlasts renewals (up to twice the
        # timeout), so that faults also catch holders that must be renewed.
        steps = rng.randrange(0, 6)
        if rng.random() < 0.05:
            steps = int(rng.uniform(0, 2 * args.timeout) / 0.01)
        for _ in range(steps):  # in 10 ms steps, stopping as soon as the lock is lost
            if lock.lost:
                break
            time.sleep(0.01)
        leave(index, token)
        try:
            lock.release()
        except LockLostError:
            stats["released_lost"] += 1
        except (redis.RedisError, LockError):
            stats["release_errors"] += 1
    watchdog = get_watchdog()
    stats["renewals"] = watchdog.renewal_calls
    stats["renewal_failures"] = watchdog.renewal_failures
    client.close()
    results.put(dict(stats))


def _leaving(leave: Callable[[int, int], None], index: int, token: int) -> Callable[[RLock], None]:
    """An ``on_lost`` callback clearing ``index``'s slot if ``token`` still marks it."""

    def on_lost(_lock: RLock) -> None:
        leave(index, token)

    return on_lost


def inject_faults(
    server: RedisServer,
    proxies: list[FaultProxy],
    args: argparse.Namespace,
    until: float,
    injected: Counter[str],
) -> None:
    """One fault at a time, at random, until ``until``; counts them in ``injected``."""
    rng = random.Random(args.seed)
    admin = server.client(socket_timeout=4 * args.timeout + 5)
    debug = server.extra_args.count("--enable-debug-command") > 0
    while time.monotonic() < until:
        time.sleep(rng.uniform(0.5, 3.0))
        if time.monotonic() >= until:
            break
        seconds = rng.uniform(0.1, 2 * args.timeout)
        kind = rng.choice(["partition", "stall", "pubsub"])
        if kind == "partition":
            proxy = rng.choice(proxies)
            proxy.blackhole()
            time.sleep(seconds)
            proxy.heal()
        elif kind == "stall" and debug and rng.random() < 0.5:
            kind = "stall (DEBUG SLEEP)"
            admin.execute_command("DEBUG", "SLEEP", f"{seconds:.3f}")  # type: ignore[no-untyped-call]
        elif kind == "stall":
            kind = "stall (CLIENT PAUSE)"
            admin.execute_command("CLIENT", "PAUSE", int(seconds * 1000), "ALL")  # type: ignore[no-untyped-call]
            time.sleep(seconds)
        else:
            admin.client_kill_filter(_type="pubsub")
        injected[kind] += 1
    admin.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300.0, help="how long to run")
    parser.add_argument("--processes", type=int, default=8, help="contending processes")
    parser.add_argument("--names", type=int, default=50, help="lock names")
    parser.add_argument("--timeout", type=float, default=3.0, help="watchdog timeout, seconds")
    parser.add_argument("--seed", type=int, default=1, help="random seed")
    parser.add_argument("--verbose", action="store_true", help="show the workers' lock warnings")
    args = parser.parse_args(argv)

    # DEBUG SLEEP needs enable-debug-command, an option Redis < 7 does not know.
    extra = ("--enable-debug-command", "yes") if server_major() >= 7 else ()

    context = multiprocessing.get_context("spawn")
    with RedisServer(*extra) as server:
        proxies = [
            FaultProxy(server.port, lifetime=args.seconds + 60) for _ in range(args.processes)
        ]
        slots: SynchronizedArray[int] = context.Array("q", args.names, lock=False)
        slots_lock = context.Lock()
        stop = context.Event()
        results: multiprocessing.Queue[dict[str, Any]] = context.Queue()
        workers = [
            context.Process(
                target=worker,
                args=(number, proxy.url),
                kwargs={
                    "args": args,
                    "slots": slots,
                    "slots_lock": slots_lock,
                    "stop": stop,
                    "results": results,
                },
                daemon=True,
            )
            for number, proxy in enumerate(proxies)
        ]
        started = time.monotonic()
        for process in workers:
            process.start()
        injected: Counter[str] = Counter()
        faults = threading.Thread(
            target=inject_faults,
            args=(server, proxies, args, started + args.seconds, injected),
            daemon=True,
        )
        faults.start()
        faults.join(args.seconds + 4 * args.timeout + 30)
        stop.set()
        totals: Counter[str] = Counter()
        reports = 0
        deadline = time.monotonic() + 30
        while reports < len(workers) and time.monotonic() < deadline:
            try:
                totals.update(results.get(timeout=1))
                reports += 1
            except queue.Empty:
                continue
        for process in workers:
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join(5)
        for proxy in proxies:
            proxy.close()
        elapsed = time.monotonic() - started

    print_table(args, totals, injected, reports, elapsed)
    return 1 if totals["violations"] or reports < len(workers) else 0


def print_table(
    args: argparse.Namespace,
    totals: Counter[str],
    injected: Counter[str],
    reports: int,
    elapsed: float,
) -> None:
    """The soak's outcome as a markdown table."""
    print(
        f"\nSoak: {args.processes} processes, {args.names} names, watchdog timeout "
        f"{args.timeout:g}s, {elapsed:.0f}s, seed {args.seed} ({reports} workers reported)\n"
    )
    print("| measure | count |\n|---|---:|")
    rows = [
        ("acquisitions", totals["acquisitions"]),
        ("renewals (watchdog EVALs)", totals["renewals"]),
        ("renewal failures", totals["renewal_failures"]),
        ("lost-lock events", totals["lost"]),
        ("releases that found the lock lost", totals["released_lost"]),
        ("acquire waits timed out (2 s)", totals["timeouts"]),
        ("acquire errors (Redis unreachable)", totals["acquire_errors"]),
        ("release errors (Redis unreachable)", totals["release_errors"]),
        ("**mutual-exclusion violations**", totals["violations"]),
    ]
    rows += [(f"faults injected: {kind}", count) for kind, count in sorted(injected.items())]
    for label, count in rows:
        print(f"| {label} | {count:,} |")


if __name__ == "__main__":
    sys.exit(main())
