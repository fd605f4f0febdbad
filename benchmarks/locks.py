"""Side-by-side lock benchmark: django-rlock vs redis-py's Lock vs python-redis-lock.

Run with ``make bench`` (or ``python -m benchmarks.locks``). Every library runs
against the same freshly started redis-server on loopback, in one run, with its
default waiting strategy (redis-py's Lock polls every 0.1 s; python-redis-lock
blocks on BLPOP; django-rlock waits on pub/sub). Results are printed as a
markdown table with ratios, ours / peer.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.synchronize import Barrier, Event
from typing import Any, Protocol

import redis
import redis.asyncio
import redis_lock

from django_rlock.core import LockClient
from django_rlock.core.aio import AsyncLockClient
from tests.servers import RedisServer


class Mutex(Protocol):
    def acquire(self) -> Any: ...
    def release(self) -> Any: ...


#: name -> factory(url, lock name) returning a blocking mutex.
LIBRARIES: dict[str, Callable[[str, str], Mutex]] = {
    "django-rlock": lambda url, name: LockClient(url, key_prefix="bench").lock(name),
    "redis-py Lock": lambda url, name: redis.Redis.from_url(url).lock(name, timeout=30),
    "python-redis-lock": lambda url, name: redis_lock.Lock(
        redis.Redis.from_url(url), name, expire=30
    ),
}
OURS = "django-rlock"


@dataclass
class Row:
    uncontended: float = 0.0
    contended: float = 0.0
    lost_updates: int = 0
    wake_p50_ms: float = 0.0
    wake_p99_ms: float = 0.0


def raw_evalsha_rate(url: str, calls: int) -> float:
    client = redis.Redis.from_url(url)
    script = client.register_script("return 1")
    script()
    started = time.perf_counter()
    for _ in range(calls):
        script()
    return calls / (time.perf_counter() - started)


#: Uncontended rates are measured in this many rounds, the libraries taking turns,
#: and each keeps its best round: a noisy neighbour then costs every library alike.
ROUNDS = 5


def uncontended_rates(url: str, cycles: int) -> dict[str, float]:
    mutexes = {library: make(url, f"uncontended:{library}") for library, make in LIBRARIES.items()}
    best = dict.fromkeys(mutexes, 0.0)
    for _ in range(ROUNDS):
        for library, mutex in mutexes.items():
            mutex.acquire()
            mutex.release()
            started = time.perf_counter()
            for _ in range(cycles // ROUNDS):
                mutex.acquire()
                mutex.release()
            best[library] = max(best[library], cycles // ROUNDS / (time.perf_counter() - started))
    return best


def _contend(
    *, library: str, url: str, seconds: float, barrier: Barrier, results: Any, index: int
) -> None:
    mutex = LIBRARIES[library](url, f"contended:{library}")
    raw = redis.Redis.from_url(url)
    counter = f"bench:count:{library}"
    done = 0
    barrier.wait(60)
    stop_at = time.monotonic() + seconds
    while time.monotonic() < stop_at:
        mutex.acquire()
        value = int(raw.get(counter) or 0)  # non-atomic on purpose: the lock must protect it
        raw.set(counter, value + 1)
        mutex.release()
        done += 1
    results[index] = done


def contended(library: str, url: str, processes: int, seconds: float) -> tuple[float, int]:
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(processes)
    results = context.Array("l", processes)
    workers = [
        context.Process(
            target=_contend,
            kwargs={
                "library": library,
                "url": url,
                "seconds": seconds,
                "barrier": barrier,
                "results": results,
                "index": index,
            },
        )
        for index in range(processes)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=seconds + 120)
    total = int(sum(results[:]))
    stored = int(redis.Redis.from_url(url).get(f"bench:count:{library}") or 0)
    return total / seconds, total - stored


def _waiter(
    *, library: str, url: str, rounds: int, ready: Event, go: Event, done: Event, samples: Any
) -> None:
    mutex = LIBRARIES[library](url, f"wake:{library}")
    for index in range(rounds):
        go.wait(30)
        go.clear()
        ready.set()
        mutex.acquire()
        samples[index] = time.monotonic()  # CLOCK_MONOTONIC is shared by all processes
        mutex.release()
        done.set()


def wake_latency(library: str, url: str, rounds: int) -> tuple[float, float]:
    context = multiprocessing.get_context("fork")
    ready, go, done = context.Event(), context.Event(), context.Event()
    acquired_at = context.Array("d", rounds)
    waiter = context.Process(
        target=_waiter,
        kwargs={
            "library": library,
            "url": url,
            "rounds": rounds,
            "ready": ready,
            "go": go,
            "done": done,
            "samples": acquired_at,
        },
    )
    waiter.start()
    mutex = LIBRARIES[library](url, f"wake:{library}")
    latencies = []
    for index in range(rounds):
        mutex.acquire()
        go.set()
        ready.wait(30)
        ready.clear()
        time.sleep(0.02)  # let the waiter block inside acquire()
        released_at = time.monotonic()
        mutex.release()
        done.wait(30)
        done.clear()
        latencies.append(acquired_at[index] - released_at)
    waiter.join(timeout=30)
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return statistics.median(latencies) * 1000, p99 * 1000


#: name -> factory(url, lock name) returning an asyncio mutex (``async with``).
ASYNC_LIBRARIES: dict[str, Callable[[str], Callable[[str], Any]]] = {
    "django-rlock (asyncio)": lambda url: AsyncLockClient(url, key_prefix="bench").lock,
    "redis-py asyncio Lock": lambda url: _redis_py_async_locks(url),  # noqa: PLW0108 -- reads as a table
}


def _redis_py_async_locks(url: str) -> Callable[[str], Any]:
    client = redis.asyncio.Redis.from_url(url)
    return lambda name: client.lock(name, timeout=30)


async def async_uncontended_rates(url: str, cycles: int) -> dict[str, float]:
    locks = {
        library: make(url)(f"async-uncontended:{library}")
        for library, make in ASYNC_LIBRARIES.items()
    }
    best = dict.fromkeys(locks, 0.0)
    for _ in range(ROUNDS):
        for library, lock in locks.items():
            async with lock:
                pass
            started = time.perf_counter()
            for _ in range(cycles // ROUNDS):
                async with lock:
                    pass
            best[library] = max(best[library], cycles // ROUNDS / (time.perf_counter() - started))
    return best


async def async_contended(library: str, url: str, tasks: int, seconds: float) -> tuple[float, int]:
    make = ASYNC_LIBRARIES[library](url)
    counter_client = redis.asyncio.Redis.from_url(url, max_connections=tasks + 10)
    counter = f"bench:async-count:{library}"
    done = [0]
    stop_at = time.monotonic() + seconds

    async def work() -> None:
        lock = make(f"async-contended:{library}")  # one object per task: redis-py needs it
        while time.monotonic() < stop_at:
            async with lock:
                value = int(await counter_client.get(counter) or 0)
                await counter_client.set(counter, value + 1)
            done[0] += 1

    await asyncio.gather(*(work() for _ in range(tasks)))
    stored = int(await counter_client.get(counter) or 0)
    await counter_client.aclose()
    return done[0] / seconds, done[0] - stored


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=5000, help="uncontended cycles per library")
    parser.add_argument("--processes", type=int, default=8, help="contending processes")
    parser.add_argument("--seconds", type=float, default=5.0, help="contended run length")
    parser.add_argument("--rounds", type=int, default=100, help="wake-up latency samples")
    parser.add_argument("--tasks", type=int, default=100, help="contending asyncio tasks")
    args = parser.parse_args()
    with RedisServer() as server:
        url = server.url
        floor = raw_evalsha_rate(url, args.cycles)
        rows = {}
        uncontended = uncontended_rates(url, args.cycles)
        for library in LIBRARIES:
            row = Row()
            row.uncontended = uncontended[library]
            row.contended, row.lost_updates = contended(library, url, args.processes, args.seconds)
            row.wake_p50_ms, row.wake_p99_ms = wake_latency(library, url, args.rounds)
            rows[library] = row
        async_uncontended = asyncio.run(async_uncontended_rates(url, args.cycles))
        async_rows = {
            library: (
                async_uncontended[library],
                *asyncio.run(async_contended(library, url, args.tasks, args.seconds)),
            )
            for library in ASYNC_LIBRARIES
        }
    print_table(rows, floor, args)
    print_async_table(async_rows, args)


def print_table(rows: dict[str, Row], floor: float, args: argparse.Namespace) -> None:
    ours = rows[OURS]
    print(f"\nRaw client floor: {floor:,.0f} EVALSHA/s (one connection, `return 1`)\n")
    print(
        f"| library | uncontended cycles/s | {args.processes}-process contended cycles/s "
        "| lost updates | wake-up p50 ms | wake-up p99 ms |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for library, row in rows.items():
        print(
            f"| {library} | {row.uncontended:,.0f} | {row.contended:,.0f} | {row.lost_updates} "
            f"| {row.wake_p50_ms:.2f} | {row.wake_p99_ms:.2f} |"
        )
    print("\nRatios, django-rlock / peer (higher is better for rates, lower for latency):\n")
    print("| peer | uncontended | contended | wake-up p50 | wake-up p99 |")
    print("|---|---:|---:|---:|---:|")
    for library, row in rows.items():
        if library == OURS:
            continue
        print(
            f"| {library} | {ours.uncontended / row.uncontended:.2f}x "
            f"| {ours.contended / row.contended:.2f}x "
            f"| {ours.wake_p50_ms / row.wake_p50_ms:.2f}x "
            f"| {ours.wake_p99_ms / row.wake_p99_ms:.2f}x |"
        )


def print_async_table(rows: dict[str, tuple[float, float, int]], args: argparse.Namespace) -> None:
    print(
        f"\n| asyncio library | uncontended cycles/s | {args.tasks}-task contended cycles/s "
        "| lost updates |"
    )
    print("|---|---:|---:|---:|")
    for library, (uncontended, contended, lost) in rows.items():
        print(f"| {library} | {uncontended:,.0f} | {contended:,.0f} | {lost} |")
    (ours_u, ours_c, _), (peer_u, peer_c, _) = rows.values()
    print(
        f"\nRatios, django-rlock / redis-py asyncio Lock: uncontended {ours_u / peer_u:.2f}x, "
        f"contended {ours_c / peer_c:.2f}x"
    )


if __name__ == "__main__":
    main()
