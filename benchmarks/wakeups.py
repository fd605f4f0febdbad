"""How soon every waiter of one client is woken when another process releases all their locks.

Run with ``python -m benchmarks.wakeups`` (``--rounds 20 --waiters 16
--watchdog 3``). Loopback only: it starts its own redis-server
(tests/servers.py). Each round, ``--waiters`` threads of one ``LockClient``
(then asyncio tasks of one ``AsyncLockClient``) each wait for their own lock,
held by another process (tests/sync/many_holder.py), which releases them all
at once. A waiter's delay runs from its lock's release to its grant; one whose
wake-up is lost waits out the holder's PTTL (up to ``--watchdog`` seconds).
The goal: every waiter within 50 ms, every round. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from collections.abc import Callable

import redis

from django_rlock.core import LockClient
from django_rlock.core.aio import AsyncLockClient
from tests.servers import RedisServer
from tests.sync.shared_listener import holder, task_round, thread_round

#: Per round, each waiter's delay in seconds.
Rounds = list[list[float]]

#: The goal: every waiter granted within this many seconds of its lock's release.
GOAL = 0.050


def threads(url: str, r: redis.Redis, rounds: int, waiters: int, watchdog: float) -> Rounds:
    with (
        LockClient(url, key_prefix="test", watchdog_timeout=watchdog) as client,
        holder(url, watchdog) as process,
    ):
        return [
            thread_round(
                client, process, r, [f"t{round_}-{i}" for i in range(waiters)], watchdog * 3
            )
            for round_ in range(rounds)
        ]


def tasks(url: str, r: redis.Redis, rounds: int, waiters: int, watchdog: float) -> Rounds:
    async def main() -> Rounds:
        async with AsyncLockClient(url, key_prefix="test", watchdog_timeout=watchdog) as client:
            return [
                await task_round(
                    client, process, r, [f"a{round_}-{i}" for i in range(waiters)], watchdog * 3
                )
                for round_ in range(rounds)
            ]

    with holder(url, watchdog) as process:
        return asyncio.run(main())


def row(kind: str, results: Rounds) -> str:
    delays = sorted(delay for result in results for delay in result)
    late = [sum(delay > GOAL for delay in result) for result in results]
    quantiles = statistics.quantiles(delays, n=100)
    return (
        f"| {kind} | {sum(not n for n in late)}/{len(results)} | {sum(late)}/{len(delays)} "
        f"| {max(late)} | {quantiles[49] * 1000:.1f} | {quantiles[98] * 1000:.1f} "
        f"| {delays[-1] * 1000:.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--waiters", type=int, default=16)
    parser.add_argument("--watchdog", type=float, default=3.0)
    args = parser.parse_args()
    kinds: dict[str, Callable[..., Rounds]] = {
        "threads, one LockClient": threads,
        "asyncio tasks, one AsyncLockClient": tasks,
    }
    print(
        f"{args.waiters} waiters, {args.rounds} rounds, watchdog {args.watchdog:g} s; "
        f"delay from a lock's release to its waiter's grant\n"
    )
    print(
        "| waiters | rounds all within 50 ms | waiters over 50 ms | most over 50 ms in a round "
        "| p50 ms | p99 ms | max ms |"
    )
    print("|---|---|---|---|---|---|---|")
    with RedisServer() as server:
        r = server.client()
        for kind, run in kinds.items():
            results = run(server.url, r, args.rounds, args.waiters, args.watchdog)
            print(row(kind, results), flush=True)
        r.close()


if __name__ == "__main__":
    main()
