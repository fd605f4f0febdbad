"""The uncontended hot path alone: paired ratios to redis-py's Lock, a profile, script costs.

A quicker companion of :mod:`benchmarks.locks` for work on the acquire and
release path (``python -m benchmarks.hotpath``): the same paired-block method
(ours and redis-py's Lock back to back, order alternating, median ratio), sync
and asyncio, then a cProfile of our sync and asyncio cycles (``--profile``) and
the server's cost of each script variant from INFO commandstats.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import statistics

import redis

from benchmarks.locks import OURS, async_uncontended, paired, uncontended_block
from django_rlock.core import LockClient
from django_rlock.core.aio import AsyncLockClient
from tests.servers import RedisServer


def sync_ratio(url: str, pairs: int, cycles: int) -> tuple[float, float, float]:
    mutexes = {
        OURS: LockClient(url, key_prefix="bench").lock("hot"),
        "redis-py Lock": redis.Redis.from_url(url).lock("hot-peer", timeout=30),
    }
    for mutex in mutexes.values():
        uncontended_block(mutex, 50)
    result = paired(lambda lib: uncontended_block(mutexes[lib], cycles), "redis-py Lock", pairs)
    return result.ratio, statistics.median(result.ours), statistics.median(result.peer)


def async_ratio(url: str, pairs: int, cycles: int) -> tuple[float, float, float]:
    result = asyncio.run(async_uncontended(url, pairs, cycles))["redis-py Lock"]
    return result.ratio, statistics.median(result.ours), statistics.median(result.peer)


def profile_sync(url: str, cycles: int) -> None:
    lock = LockClient(url, key_prefix="prof").lock("p")
    uncontended_block(lock, 50)
    profiler = cProfile.Profile()
    profiler.enable()
    uncontended_block(lock, cycles)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def profile_async(url: str, cycles: int) -> None:
    async def main() -> None:
        lock = AsyncLockClient(url, key_prefix="prof").lock("pa")
        for _ in range(50):
            async with lock:
                pass
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(cycles):
            async with lock:
                pass
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)

    asyncio.run(main())


def script_costs(url: str, calls: int) -> dict[str, float]:
    """EVALSHA µs per call on the server (INFO commandstats), per cycle kind.

    A fresh grant and its final release, then a re-entry and the release of
    that re-entry (the outer hold kept): each the mean of its two scripts.
    """
    admin = redis.Redis.from_url(url)
    lock = LockClient(url, key_prefix="cost").lock("c")

    def measure() -> float:
        admin.config_resetstat()
        for _ in range(calls):
            lock.acquire()
            lock.release()
        return float(admin.info("commandstats")["cmdstat_evalsha"]["usec_per_call"])

    fresh = measure()
    lock.acquire()
    reentry = measure()
    lock.release()
    return {"fresh grant + final release": fresh, "re-entry + its release": reentry}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--cycles", type=int, default=400)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--no-async", action="store_true")
    args = parser.parse_args()
    with RedisServer() as server:
        url = server.url
        if args.profile:
            profile_sync(url, 3000)
            if not args.no_async:
                profile_async(url, 3000)
        for label, cost in script_costs(url, 500).items():
            print(f"server EVALSHA µs/call, {label}: {cost:.2f}")
        ratio, ours, peer = sync_ratio(url, args.pairs, args.cycles)
        print(
            f"sync uncontended: {ratio:.3f}x redis-py Lock (ours {ours:,.0f}/s, peer {peer:,.0f}/s)"
        )
        if not args.no_async:
            ratio, ours, peer = async_ratio(url, args.pairs, args.cycles)
            print(
                f"asyncio uncontended: {ratio:.3f}x redis-py Lock "
                f"(ours {ours:,.0f}/s, peer {peer:,.0f}/s)"
            )


if __name__ == "__main__":
    main()
