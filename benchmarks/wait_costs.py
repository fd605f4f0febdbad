"""What a contended cycle costs, part by part: the wait loop's choices side by side.

Run with ``python -m benchmarks.wait_costs`` (``--processes 4 8 --pairs 6
--seconds 2``). Loopback only: it starts its own redis-server
(tests/servers.py). Each block is ``processes`` forked processes doing the
read-modify-write cycle of ``benchmarks.locks`` on one lock for ``--seconds``;
the ways below run in alternating order, ``--pairs`` blocks each, so their
ratios to python-redis-lock are paired within one run (the machine may be
shared: trust the ratios and the per-cycle counts, not the absolute rates).

Ways (each worker process switches one part of the shipped code off, in the
worker only, before it makes its client):

- ``django-rlock``: as shipped;
- ``no lingering``: every waiter unsubscribes when it leaves, and every wait
  begins with an attempt that does not wait (the code before lingering channels);
- ``no hand-over``: waiters are only woken, never handed the lock (wake-only
  names, as on a cluster);
- ``hand-over after 5 ms only``: a waiter that was woken and lost does not say
  it starves; only one that has waited ``STARVING_AFTER`` is handed the lock;
- ``python-redis-lock``: the peer, for the ratios.

Per cycle it reports the client CPU (all processes' ``process_time``), the
server's CPU (INFO cpu), and the commands the server ran (INFO commandstats,
scripts' inner calls and the cycle's own GET and SET included): SUBSCRIBE and
EVALSHA separately.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Barrier
from typing import Any

import redis

from benchmarks import locks as peers
from tests.servers import RedisServer

OURS = peers.OURS
PEER = "python-redis-lock"


def _no_lingering() -> None:
    from django_rlock.core._protocol.channels import ChannelTable  # noqa: PLC0415 -- in the worker

    remove_all = ChannelTable.remove_all

    def eager(self: Any, names: Any, waiter: Any, *, linger: float | None = None) -> Any:
        return remove_all(self, names, waiter)

    ChannelTable.remove_all = eager  # type: ignore[method-assign]


def _no_hand_over() -> None:
    from django_rlock.core._protocol import channels  # noqa: PLC0415 -- in the worker
    from django_rlock.core._sync import waiting  # noqa: PLC0415

    def wake_only(*, hand_over: bool = True) -> str:
        return channels.new_wake_name(hand_over=False)

    # The listener's own import of the name (waiting.py), replaced in this worker only.
    vars(waiting)["new_wake_name"] = wake_only


def _time_only() -> None:
    from django_rlock.core._protocol import clock  # noqa: PLC0415 -- in the worker
    from django_rlock.core._protocol.lock import STARVING_AFTER  # noqa: PLC0415
    from django_rlock.core._sync import locks  # noqa: PLC0415

    def starving(self: Any) -> bool:
        return bool(clock.monotonic() - self.started >= STARVING_AFTER)

    locks._Waiting._starving = starving  # type: ignore[method-assign]


#: Way -> (library, what the worker switches off first).
WAYS: dict[str, tuple[str, Callable[[], None] | None]] = {
    OURS: (OURS, None),
    "no lingering": (OURS, _no_lingering),
    "no hand-over": (OURS, _no_hand_over),
    "hand-over after 5 ms only": (OURS, _time_only),
    PEER: (PEER, None),
}


def _worker(way: str, cpu: Synchronized[float], **kwargs: Any) -> None:
    started = time.process_time()
    library, switch_off = WAYS[way]
    if switch_off is not None:
        switch_off()
    try:
        peers._contend(library=library, **kwargs)
    finally:
        with cpu.get_lock():
            cpu.value += time.process_time() - started


@dataclass
class Block:
    """One block's rate and its costs per cycle."""

    rate: float
    client_us: float
    server_us: float
    commands: dict[str, float] = field(default_factory=dict)
    lost: int = 0


def _server_cpu(admin: redis.Redis) -> float:
    info = admin.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _commands(admin: redis.Redis) -> dict[str, int]:
    stats = admin.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in stats.items()}


def block(url: str, way: str, processes: int, seconds: float, number: int) -> Block:
    """``processes`` workers of ``way`` contending for one lock for ``seconds``."""
    context = multiprocessing.get_context("fork")
    barrier: Barrier = context.Barrier(processes + 1)
    done: Synchronized[int] = context.Value("l", 0)
    messages: Synchronized[int] = context.Value("l", 0)
    cpu: Synchronized[float] = context.Value("d", 0.0)
    counter = f"bench:wait-costs:{processes}:{number}"
    admin = redis.Redis.from_url(url)
    workers = [
        context.Process(
            target=_worker,
            args=(way, cpu),
            kwargs={
                "url": url,
                "counter": counter,
                "seconds": seconds,
                "barrier": barrier,
                "done": done,
                "messages": messages,
            },
        )
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    barrier.wait(60)
    server_before, commands_before = _server_cpu(admin), _commands(admin)
    started = time.monotonic()
    for worker in workers:
        worker.join(timeout=seconds + 60)
    elapsed = time.monotonic() - started
    server_after, commands_after = _server_cpu(admin), _commands(admin)
    cycles = max(int(done.value), 1)
    ran = {
        name: (calls - commands_before.get(name, 0)) / cycles
        for name, calls in commands_after.items()
        if name != "info"  # the admin's own reads
    }
    stored = int(admin.get(counter) or 0)
    admin.close()
    return Block(
        rate=int(done.value) / elapsed,
        client_us=cpu.value / cycles * 1e6,
        server_us=(server_after - server_before) / cycles * 1e6,
        commands={name: count for name, count in ran.items() if count},
        lost=int(done.value) - stored,
    )


def run(url: str, processes: int, pairs: int, seconds: float) -> dict[str, list[Block]]:
    """``pairs`` blocks of every way, their order alternating."""
    blocks: dict[str, list[Block]] = {way: [] for way in WAYS}
    ways = list(WAYS)
    numbers = itertools.count()
    for index in range(pairs):
        for way in ways if index % 2 == 0 else ways[::-1]:
            blocks[way].append(block(url, way, processes, seconds, next(numbers)))
    return blocks


def table(processes: int, blocks: dict[str, list[Block]]) -> str:
    """One markdown table: each way's ratio to the peer and its costs per cycle (medians)."""
    peer = blocks[PEER]
    lines = [
        f"| {processes} processes | rate vs {PEER} (pairs) | client CPU µs/cycle | "
        "server CPU µs/cycle | commands/cycle | SUBSCRIBE/cycle | EVALSHA/cycle | lost |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for way, rows in blocks.items():
        ratios = [row.rate / other.rate for row, other in zip(rows, peer, strict=True)]

        def median(read: Callable[[Block], float], rows: list[Block] = rows) -> float:
            return statistics.median(read(row) for row in rows)

        lines.append(
            f"| {way} | **{statistics.median(ratios):.2f}x** "
            f"({', '.join(f'{ratio:.2f}' for ratio in ratios)}) "
            f"| {median(lambda row: row.client_us):.0f} | {median(lambda row: row.server_us):.0f} "
            f"| {median(lambda row: sum(row.commands.values())):.1f} "
            f"| {median(lambda row: row.commands.get('subscribe', 0.0)):.2f} "
            f"| {median(lambda row: row.commands.get('evalsha', 0.0)):.2f} "
            f"| {sum(row.lost for row in rows)} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    with RedisServer() as server:
        for processes in args.processes:
            print(table(processes, run(server.url, processes, args.pairs, args.seconds)))
            print()


if __name__ == "__main__":
    main()
