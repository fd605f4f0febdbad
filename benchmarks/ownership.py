"""How long after its owner's scope ends a hold is given back (docs/guarantees.md, Ownership).

Run with ``python -m benchmarks.ownership`` (``--rounds 30``). Loopback only:
it starts its own redis-server (tests/servers.py). For each way a scope ends,
a hold is left in it, and a rival on another client measures, from the
scope's end, how long until it gets the lock: the median and the worst of
``--rounds`` rounds, in milliseconds. Prints a markdown table.

* unit of work: ``work_ended`` (what ``request_finished`` and Celery's
  ``task_postrun`` call) with a hold of the unit still held;
* asyncio task: a task that called ``acquire()`` finishes holding;
* worker thread: a thread ends holding (found at the watchdog's next tick,
  a third of the watchdog timeout: 1 s here, ``--watchdog 3``);
* process exit: a script's main thread holds as the process exits.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from django_rlock.core import LockClient
from django_rlock.core._process import leaks
from django_rlock.core.aio import AsyncLockClient
from tests.servers import RedisServer

HANG = 30.0


def _free_after(client: LockClient, name: str, since: float) -> float:
    """Milliseconds from ``since`` until ``client`` gets lock ``name``, which it gives back."""
    lock = client.lock(name)
    assert lock.acquire(timeout=HANG), f"{name} still held after {HANG}s"
    took = time.monotonic()
    lock.release()
    return (took - since) * 1000


def unit_end(url: str, rival: LockClient, watchdog: float, name: str) -> float:
    with LockClient(url, watchdog_timeout=watchdog) as client:
        leaks.work_started("request")
        client.lock(name).acquire()
        ended = time.monotonic()
        leaks.work_ended("request")
        return _free_after(rival, name, ended)


def task_end(url: str, rival: LockClient, watchdog: float, name: str) -> float:
    ended: list[float] = []

    async def main() -> None:
        async with AsyncLockClient(url, watchdog_timeout=watchdog) as client:

            async def take() -> None:
                await client.lock(name).acquire()
                ended.append(time.monotonic())

            await asyncio.create_task(take())
            await asyncio.to_thread(lambda: ended.append(_free_after(rival, name, ended[0])))

    asyncio.run(main())
    return ended[1]


def thread_end(url: str, rival: LockClient, watchdog: float, name: str) -> float:
    with LockClient(url, watchdog_timeout=watchdog) as client:
        ended: list[float] = []

        def take() -> None:
            client.lock(name).acquire()
            ended.append(time.monotonic())

        thread = threading.Thread(target=take)
        thread.start()
        thread.join(HANG)
        return _free_after(rival, name, ended[0])


EXITING = """
import sys
from django_rlock.core import LockClient
LockClient(sys.argv[1], watchdog_timeout=float(sys.argv[3])).lock(sys.argv[2]).acquire()
"""


def process_exit(url: str, rival: LockClient, watchdog: float, name: str) -> float:
    process = subprocess.Popen([sys.executable, "-c", EXITING, url, name, str(watchdog)])
    process.wait(HANG)
    return _free_after(rival, name, time.monotonic())


SCOPES: dict[str, Callable[[str, LockClient, float, str], float]] = {
    "unit of work ends (request, task run)": unit_end,
    "asyncio task ends": task_end,
    "worker thread ends": thread_end,
    "process exits (main thread's holds)": process_exit,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--watchdog", type=float, default=3.0)
    args = parser.parse_args()
    with RedisServer() as server:
        url = server.url
        print(f"watchdog timeout {args.watchdog:g} s, {args.rounds} rounds\n")
        print("| scope end | median ms | worst ms |")
        print("|---|---|---|")
        with LockClient(url, watchdog_timeout=args.watchdog) as rival:
            for label, measure in SCOPES.items():
                rounds = args.rounds if measure is not process_exit else min(args.rounds, 10)
                delays = [
                    measure(url, rival, args.watchdog, f"own-{index}-{label[:4]}")
                    for index in range(rounds)
                ]
                print(f"| {label} | {statistics.median(delays):.1f} | {max(delays):.1f} |")


if __name__ == "__main__":
    main()
