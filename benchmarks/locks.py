"""Side-by-side lock benchmark: django-rlock against the Python Redis locks people use.

Run with ``make bench`` (or ``python -m benchmarks.locks``); docs/benchmarks.md
shows a run and explains it. Every library runs against the same freshly started
redis-server on loopback, in one run, with its default waiting strategy
(redis-py's Lock polls every 0.1 s; python-redis-lock blocks on BLPOP; pottery's
Redlock retries after a random pause; django-rlock waits on pub/sub). pottery
joins when it is importable.

Robust on a noisy machine: each comparison is a series of *pairs*, one block of
django-rlock and one block of the peer run back to back, the order alternating
from pair to pair; a pair gives one ratio (ours / peer), and the result is the
median of those ratios. A neighbour's burst of work then lands in one pair and
moves one ratio, not the result; no library is credited with its luckiest round.

Prints a markdown table (ratios ours / peer, and each library's absolute median;
contended at 4 and 8 processes; the server's CPU per uncontended cycle, paired
like the rest; and the protocol's limit, the library's own scripts on a raw
socket, :mod:`benchmarks.protocol_limit`, against the same peers in the same run)
and where the time goes (round trips and the server's own cost per cycle, from
INFO commandstats), and writes a chart of the ratios (SVG) to ``--chart``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import multiprocessing
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path
from typing import Any, Protocol

import redis
import redis.asyncio
import redis_lock

from benchmarks import face, serverside
from benchmarks.protocol_limit import our_protocol
from django_rlock.core import LockClient
from django_rlock.core.aio import AsyncLockClient
from tests.servers import RedisServer


class Mutex(Protocol):
    def acquire(self) -> Any: ...
    def release(self) -> Any: ...


class AsyncMutex(Protocol):
    async def __aenter__(self) -> Any: ...
    async def __aexit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> Any: ...


OURS = "django-rlock"
HAS_POTTERY = importlib.util.find_spec("pottery") is not None


def _pottery_lock(url: str, name: str) -> Mutex:
    from pottery import Redlock  # noqa: PLC0415 -- optional peer

    return Redlock(key=name, masters={redis.Redis.from_url(url)}, auto_release_time=30)


#: name -> factory(url, lock name) returning a blocking mutex. Every factory
#: builds its own client: a forked worker calls it after the fork.
LIBRARIES: dict[str, Callable[[str, str], Mutex]] = {
    OURS: lambda url, name: LockClient(url, key_prefix="bench").lock(name),
    "redis-py Lock": lambda url, name: redis.Redis.from_url(url).lock(name, timeout=30),
    "python-redis-lock": lambda url, name: redis_lock.Lock(
        redis.Redis.from_url(url), name, expire=30
    ),
}
if HAS_POTTERY:
    LIBRARIES["pottery Redlock"] = _pottery_lock
PEERS = [library for library in LIBRARIES if library != OURS]


def _async_pottery(url: str) -> Callable[[str], AsyncMutex]:
    from pottery import AIORedlock  # noqa: PLC0415 -- optional peer

    client = redis.asyncio.Redis.from_url(url)
    return lambda name: AIORedlock(key=name, masters={client}, auto_release_time=30)


def _async_redis_py(url: str) -> Callable[[str], AsyncMutex]:
    client = redis.asyncio.Redis.from_url(url)
    return lambda name: client.lock(name, timeout=30)


def _async_ours(url: str) -> Callable[[str], AsyncMutex]:
    return AsyncLockClient(url, key_prefix="bench").lock


#: Column name -> factory(url) returning a maker of asyncio mutexes (``async with``).
ASYNC_LIBRARIES: dict[str, Callable[[str], Callable[[str], AsyncMutex]]] = {
    OURS: _async_ours,
    "redis-py Lock": _async_redis_py,
}
if HAS_POTTERY:
    ASYNC_LIBRARIES["pottery Redlock"] = _async_pottery


@dataclass
class Paired:
    """One comparison: the per-pair ratios (ours / peer) and each side's block values."""

    ratios: list[float] = field(default_factory=list)
    ours: list[float] = field(default_factory=list)
    peer: list[float] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)


def paired(run: Callable[[str], float], peer: str, pairs: int) -> Paired:
    """``pairs`` back-to-back blocks of ours and ``peer``, the order alternating."""
    return paired_between(run, OURS, peer, pairs)


def paired_between(run: Callable[[str], float], ours: str, peer: str, pairs: int) -> Paired:
    """``pairs`` back-to-back blocks of ``ours`` and ``peer`` (any two keys of ``run``)."""
    result = Paired()
    for index in range(pairs):
        order = (ours, peer) if index % 2 == 0 else (peer, ours)
        values = {way: run(way) for way in order}
        result.ours.append(values[ours])
        result.peer.append(values[peer])
        result.ratios.append(values[ours] / values[peer])
    return result


async def paired_async(run: Callable[[str], Awaitable[float]], peer: str, pairs: int) -> Paired:
    """:func:`paired` for asyncio blocks."""
    result = Paired()
    for index in range(pairs):
        order = (OURS, peer) if index % 2 == 0 else (peer, OURS)
        values = {library: await run(library) for library in order}
        result.ours.append(values[OURS])
        result.peer.append(values[peer])
        result.ratios.append(values[OURS] / values[peer])
    return result


# -- uncontended ----------------------------------------------------------------------


def uncontended_block(mutex: Mutex, cycles: int) -> float:
    """Acquire+release cycles per second over ``cycles`` cycles."""
    started = time.perf_counter()
    for _ in range(cycles):
        mutex.acquire()
        mutex.release()
    return cycles / (time.perf_counter() - started)


def uncontended(url: str, pairs: int, cycles: int) -> dict[str, Paired]:
    mutexes = {library: make(url, f"uncontended:{library}") for library, make in LIBRARIES.items()}
    for mutex in mutexes.values():
        uncontended_block(mutex, 20)  # connections made, scripts loaded
    return {
        peer: paired(lambda library: uncontended_block(mutexes[library], cycles), peer, pairs)
        for peer in PEERS
    }


def protocol_limit(url: str, pairs: int, cycles: int) -> dict[str, Paired]:
    """The library's own scripts on a raw socket (benchmarks/protocol_limit.py) against each peer.

    The limit of the protocol: what :func:`uncontended` would measure with no
    Python around the two script calls but the loop.
    """
    mutexes = {library: make(url, f"limit:{library}") for library, make in LIBRARIES.items()}
    for mutex in mutexes.values():
        uncontended_block(mutex, 20)

    def run(library: str) -> float:
        if library == OURS:
            return our_protocol(url, cycles)
        return uncontended_block(mutexes[library], cycles)

    return {peer: paired(run, peer, pairs) for peer in PEERS}


async def async_uncontended_block(lock: AsyncMutex, cycles: int) -> float:
    started = time.perf_counter()
    for _ in range(cycles):
        async with lock:
            pass
    return cycles / (time.perf_counter() - started)


async def async_uncontended(url: str, pairs: int, cycles: int) -> dict[str, Paired]:
    locks = {
        library: make(url)(f"async-uncontended:{library}")
        for library, make in ASYNC_LIBRARIES.items()
    }
    for lock in locks.values():
        await async_uncontended_block(lock, 20)
    return {
        peer: await paired_async(
            lambda library: async_uncontended_block(locks[library], cycles), peer, pairs
        )
        for peer in ASYNC_LIBRARIES
        if peer != OURS
    }


class AsyncContended:
    """Blocks of ``tasks`` asyncio tasks on one event loop contending for one lock.

    Each task takes the lock in a loop, through a lock object of its own (a
    redis-py Lock keeps one token per object), and does a deliberately
    non-atomic read-modify-write of a counter inside it, through a plain
    ``redis.asyncio`` client shared by every library; cycles counted by the
    tasks minus the counter's value are the updates lost.
    """

    def __init__(self, url: str, tasks: int, seconds: float) -> None:
        self.url, self.tasks, self.seconds = url, tasks, seconds
        self.lost: dict[str, int] = {}
        self._makers = {library: make(url) for library, make in ASYNC_LIBRARIES.items()}
        self._blocks = 0

    async def block(self, library: str) -> float:
        """Cycles per second of all tasks together over one block."""
        make = self._makers[library]
        self._blocks += 1
        counter = f"bench:async-count:{self._blocks}"
        raw = redis.asyncio.Redis.from_url(self.url)
        cycles = 0

        async def work() -> None:
            nonlocal cycles
            lock = make(f"async-contended:{library}")
            while time.monotonic() < stop_at:
                async with lock:
                    value = int(await raw.get(counter) or 0)  # the lock must protect it
                    await raw.set(counter, value + 1)
                cycles += 1

        started = time.monotonic()
        stop_at = started + self.seconds
        await asyncio.gather(*(work() for _ in range(self.tasks)))
        elapsed = time.monotonic() - started
        stored = int(await raw.get(counter) or 0)
        await raw.aclose()
        self.lost[library] = self.lost.get(library, 0) + cycles - stored
        return cycles / elapsed


async def async_contended(
    url: str, tasks: int, seconds: float, pairs: int
) -> tuple[dict[str, Paired], dict[str, int]]:
    """:class:`AsyncContended` blocks paired against each asyncio peer, and the updates lost."""
    contention = AsyncContended(url, tasks, seconds)
    results = {
        peer: await paired_async(contention.block, peer, pairs)
        for peer in ASYNC_LIBRARIES
        if peer != OURS
    }
    return results, contention.lost


# -- contended ------------------------------------------------------------------------


def _contend(
    *,
    library: str,
    url: str,
    counter: str,
    seconds: float,
    barrier: Barrier,
    done: Any,
    messages: Any,
) -> None:
    mutex = LIBRARIES[library](url, f"contended:{library}")
    raw = redis.Redis.from_url(url)
    cycles = 0
    barrier.wait(60)
    stop_at = time.monotonic() + seconds
    while time.monotonic() < stop_at:
        mutex.acquire()
        value = int(raw.get(counter) or 0)  # non-atomic on purpose: the lock must protect it
        raw.set(counter, value + 1)
        mutex.release()
        cycles += 1
    with done.get_lock():
        done.value += cycles
    # Ours: the release messages this process's listener read (see Contended.messages).
    listener = getattr(getattr(mutex, "client", None), "listener", None)
    if listener is not None:
        with messages.get_lock():
            messages.value += listener.messages


class Contended:
    """Blocks of ``processes`` processes contending for one lock; counts lost updates."""

    def __init__(self, url: str, processes: int, seconds: float) -> None:
        self.url, self.processes, self.seconds = url, processes, seconds
        self.lost: dict[str, int] = {}
        #: Ours, per block: release messages read by all processes per cycle. A
        #: release that reaches every waiting process costs ~processes - 1; one
        #: published to the woken waiter's own channel, ~1.
        self.messages: list[float] = []
        self._blocks = 0

    def block(self, library: str) -> float:
        """Cycles per second of all processes together over one block."""
        context = multiprocessing.get_context("fork")
        barrier = context.Barrier(self.processes + 1)
        done: Synchronized[int] = context.Value("l", 0)
        messages: Synchronized[int] = context.Value("l", 0)
        self._blocks += 1
        counter = f"bench:count:{self.processes}:{self._blocks}"
        workers = [
            context.Process(
                target=_contend,
                kwargs={
                    "library": library,
                    "url": self.url,
                    "counter": counter,
                    "seconds": self.seconds,
                    "barrier": barrier,
                    "done": done,
                    "messages": messages,
                },
            )
            for _ in range(self.processes)
        ]
        for worker in workers:
            worker.start()
        barrier.wait(60)  # every worker is connected: the clock starts with all of them
        started = time.monotonic()
        for worker in workers:
            worker.join(timeout=self.seconds + 60)
        elapsed = time.monotonic() - started
        total = int(done.value)
        stored = int(redis.Redis.from_url(self.url).get(counter) or 0)
        self.lost[library] = self.lost.get(library, 0) + total - stored
        if library == OURS and total:
            self.messages.append(int(messages.value) / total)
        return total / elapsed


# -- wake-up latency ------------------------------------------------------------------


def _waiter(*, library: str, url: str, rounds: int, ready: Event, go: Event, samples: Any) -> None:
    mutex = LIBRARIES[library](url, f"wake:{library}")
    for index in range(rounds):
        go.wait(30)
        go.clear()
        ready.set()
        mutex.acquire()
        samples[index] = time.monotonic()  # CLOCK_MONOTONIC is shared by all processes
        mutex.release()


def wake_block(library: str, url: str, rounds: int) -> float:
    """Median ms of ``rounds`` wake-ups: the holder's release() -> the waiter holds."""
    context = multiprocessing.get_context("fork")
    ready, go = context.Event(), context.Event()
    acquired_at = context.Array("d", rounds)
    waiter = context.Process(
        target=_waiter,
        kwargs={
            "library": library,
            "url": url,
            "rounds": rounds,
            "ready": ready,
            "go": go,
            "samples": acquired_at,
        },
    )
    mutex = LIBRARIES[library](url, f"wake:{library}")
    waiter.start()
    latencies: list[float] = []
    for index in range(rounds):
        mutex.acquire()
        go.set()
        ready.wait(30)
        ready.clear()
        time.sleep(0.02)  # let the waiter block inside acquire()
        released_at = time.monotonic()
        mutex.release()
        # The waiter holds, then releases; taking the lock again waits for that.
        deadline = time.monotonic() + 30
        while acquired_at[index] == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        latencies.append(acquired_at[index] - released_at)
    waiter.join(timeout=30)
    return statistics.median(latencies) * 1000


# -- where the time goes --------------------------------------------------------------


@dataclass
class ServerCost:
    """What one uncontended acquire+release costs the server, and the whole cycle."""

    commands: float  # every command the server ran, those inside scripts included
    server_cpu_us: float  # the server's CPU time (user + system, socket I/O included)
    evalsha_us: float  # INFO commandstats' usec_per_call of EVALSHA (0: none sent)
    cycle_us: float  # the cycle as the client sees it


def _server_cpu(admin: redis.Redis) -> float:
    cpu = admin.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def server_cost(url: str, library: str, cycles: int) -> ServerCost:
    """INFO commandstats and cpu around ``cycles`` uncontended cycles of ``library``."""
    admin = redis.Redis.from_url(url)
    mutex = LIBRARIES[library](url, f"cost:{library}")
    uncontended_block(mutex, 20)
    admin.config_resetstat()
    cpu_before = _server_cpu(admin)
    rate = uncontended_block(mutex, cycles)
    cpu = _server_cpu(admin) - cpu_before
    stats = admin.info("commandstats")
    # The admin's own INFO and CONFIG calls are not the lock's.
    calls = sum(
        int(stat["calls"])
        for name, stat in stats.items()
        if not name.startswith(("cmdstat_info", "cmdstat_config"))
    )
    evalsha = stats.get("cmdstat_evalsha", {})
    return ServerCost(
        commands=calls / cycles,
        server_cpu_us=cpu * 1e6 / cycles,
        evalsha_us=float(evalsha.get("usec_per_call", 0.0)),
        cycle_us=1e6 / rate,
    )


class ServerCpu:
    """The server's CPU time per uncontended cycle (INFO cpu), block by block, to pair."""

    def __init__(self, url: str, cycles: int = 1000) -> None:
        self.url = url
        self.admin = redis.Redis.from_url(url)
        self.cycles = cycles
        self.mutexes: dict[str, Mutex] = {}

    def block(self, library: str) -> float:
        """µs of server CPU (user + system, socket I/O included) per cycle over one block."""
        mutex = self.mutexes.get(library)
        if mutex is None:
            mutex = self.mutexes[library] = LIBRARIES[library](self.url, f"cpu:{library}")
            uncontended_block(mutex, 20)
        before = _server_cpu(self.admin)
        uncontended_block(mutex, self.cycles)
        return (_server_cpu(self.admin) - before) * 1e6 / self.cycles


def round_trip_us(url: str, calls: int) -> dict[str, float]:
    """The floor: one round trip of PING and of a trivial EVALSHA through redis-py, in µs."""
    client = redis.Redis.from_url(url)
    script = client.register_script("return 1")
    script()
    started = time.perf_counter()
    for _ in range(calls):
        client.ping()
    ping = (time.perf_counter() - started) / calls
    started = time.perf_counter()
    for _ in range(calls):
        script()
    evalsha = (time.perf_counter() - started) / calls
    return {"PING": ping * 1e6, "EVALSHA of `return 1`": evalsha * 1e6}


# -- the rate limiter's cost, next to a lock cycle ------------------------------------


def call_cost(url: str, call: Callable[[], object], calls: int, blocks: int = 5) -> ServerCost:
    """What one ``call()`` costs: the server's commands and CPU, and the client's median µs.

    ``blocks`` blocks of ``calls`` calls; the client's time is the median block's.
    """
    admin = redis.Redis.from_url(url)
    for _ in range(20):
        call()  # connected, scripts loaded
    admin.config_resetstat()
    cpu_before = _server_cpu(admin)
    per_call = []
    for _ in range(blocks):
        started = time.perf_counter()
        for _ in range(calls):
            call()
        per_call.append((time.perf_counter() - started) / calls)
    cpu = _server_cpu(admin) - cpu_before
    stats = admin.info("commandstats")
    admin.close()
    ran = sum(
        int(stat["calls"])
        for name, stat in stats.items()
        if not name.startswith(("cmdstat_info", "cmdstat_config"))
    )
    evalsha = stats.get("cmdstat_evalsha", {})
    return ServerCost(
        commands=ran / (calls * blocks),
        server_cpu_us=cpu * 1e6 / (calls * blocks),
        evalsha_us=float(evalsha.get("usec_per_call", 0.0)),
        cycle_us=statistics.median(per_call) * 1e6,
    )


def limiter_costs(calls: int) -> dict[str, ServerCost]:
    """The rate limiter's calls and a plain lock's cycle, on a server of their own."""
    with RedisServer() as server, LockClient(server.url, key_prefix="bench") as client:
        lock = client.lock("cost:lock")
        granted = client.rate_limiter("cost:granted", "1000000/s")  # never short of permits
        refused = client.rate_limiter("cost:refused", "1/d", burst=1)
        refused.try_acquire()  # and none left here for a day

        def cycle() -> None:
            lock.acquire()
            lock.release()

        rows: dict[str, Callable[[], object]] = {
            "lock cycle: acquire + release": cycle,
            "rate limiter: try_acquire(), granted": granted.try_acquire,
            "rate limiter: try_acquire(), refused": refused.try_acquire,
            "rate limiter: wait_time()": granted.wait_time,
        }
        return {label: call_cost(server.url, call, calls) for label, call in rows.items()}


def limiter_table(costs: dict[str, ServerCost]) -> str:
    """The rate limiter's cost per call next to a lock cycle's (the same columns as cost_table)."""
    lines = [
        "| django-rlock, one call | commands run (scripts' included) "
        "| EVALSHA µs/call | server CPU µs | µs at the client |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, cost in costs.items():
        lines.append(
            f"| {label} | {cost.commands:.1f} | {cost.evalsha_us:.1f} "
            f"| {cost.server_cpu_us:.0f} | {cost.cycle_us:.0f} |"
        )
    return "\n".join(lines)


# -- the run --------------------------------------------------------------------------


@dataclass
class Results:
    uncontended: dict[str, Paired]
    limit: dict[str, Paired]
    asyncio: dict[str, Paired]
    #: ``--tasks`` asyncio tasks on one loop, and the updates each library lost there.
    async_contended: dict[str, Paired]
    async_lost: dict[str, int]
    #: Per number of contending processes.
    contended: dict[int, dict[str, Paired]]
    wake: dict[str, Paired]
    #: Per number of contending processes, per library.
    lost: dict[int, dict[str, int]]
    #: Per number of contending processes: ours' release messages read per cycle, per block.
    messages: dict[int, list[float]]
    #: Per library: the server's CPU µs per uncontended cycle, one per pair of blocks.
    server_cpu: dict[str, Paired]
    costs: dict[str, ServerCost]
    floor: dict[str, float]
    #: The Django face's rows (benchmarks/face.py), by row label.
    face: dict[str, Paired] = field(default_factory=dict)
    #: The client's CPU µs per cycle of each way of the face's rows.
    face_cpu: dict[str, float] = field(default_factory=dict)
    #: Each library's own commands on a raw socket, ours against each peer's.
    raw: dict[str, Paired] = field(default_factory=dict)
    #: Per library: commands and server CPU per raw cycle, and the saturated ceiling.
    raw_costs: dict[str, serverside.Cost] = field(default_factory=dict)
    ceilings: dict[str, serverside.Ceiling] = field(default_factory=dict)


def run(args: argparse.Namespace) -> Results:
    with RedisServer() as server:
        url = server.url
        floor = round_trip_us(url, 2000)
        unc = uncontended(url, args.pairs, args.cycles)
        limit = protocol_limit(url, args.limit_pairs, args.cycles)
        aio = asyncio.run(async_uncontended(url, args.pairs, args.cycles))
        aio_contended, aio_lost = asyncio.run(
            async_contended(url, args.tasks, args.seconds, args.contended_pairs)
        )
        contended, lost, messages = {}, {}, {}
        for processes in args.processes:
            contention = Contended(url, processes, args.seconds)
            contended[processes] = {
                peer: paired(contention.block, peer, args.contended_pairs) for peer in PEERS
            }
            lost[processes] = contention.lost
            messages[processes] = contention.messages
        wake = {
            peer: paired(
                lambda library: wake_block(library, url, args.rounds), peer, args.wake_pairs
            )
            for peer in PEERS
        }
        cpu = ServerCpu(url)
        server_cpu = {peer: paired(cpu.block, peer, args.cpu_pairs) for peer in PEERS}
        costs = {library: server_cost(url, library, 1000) for library in LIBRARIES}
        results = Results(
            unc, limit, aio, aio_contended, aio_lost, contended, wake, lost, messages, server_cpu,
            costs,
            floor,
        )  # fmt: skip
        face_rows(url, args, results)
        server_side(url, args, results)
    return results


def face_rows(url: str, args: argparse.Namespace, results: Results) -> None:
    """The Django face against django-redis, and a lock object per cycle (benchmarks/face.py)."""
    blocks = face.FaceBlocks(url, args.face_cycles)
    for label, ours, peer in face.ROWS:
        results.face[label] = paired_between(blocks.block, ours, peer, args.face_pairs)
    results.face_cpu = {way: blocks.client_cpu_us(way) for way in blocks.ways}


def server_side(url: str, args: argparse.Namespace, results: Results) -> None:
    """Raw against raw, commands and server CPU per cycle, the ceiling (serverside.py)."""
    raw = serverside.RawBlocks(url, args.cycles)
    try:
        results.raw = {
            peer: paired_between(raw.block, OURS, peer, args.limit_pairs)
            for peer in serverside.RAW
            if peer != OURS
        }
    finally:
        raw.close()
    for library in serverside.RAW:
        results.raw_costs[library] = serverside.server_cost(url, library, 1000)
        results.ceilings[library] = serverside.ceiling(
            url, library, args.ceiling_processes, args.ceiling_connections, args.ceiling_seconds
        )


def _ours(results: dict[str, Paired]) -> float:
    return statistics.median([value for pair in results.values() for value in pair.ours])


def table(results: Results, args: argparse.Namespace) -> str:
    """The markdown table: each cell is ours / peer (the peer's absolute median)."""
    peers = PEERS
    lines = [
        "| | " + " | ".join([OURS, *peers]) + " |",
        "|---|" + "---:|" * (len(peers) + 1),
    ]

    def row(
        label: str,
        data: dict[str, Paired],
        unit: Callable[[float], str],
        lost: dict[str, int] | None = None,
    ) -> None:
        def losses(library: str) -> str:
            return "" if lost is None else f", {lost.get(library, 0)} lost"

        cells = [unit(_ours(data)) + losses(OURS)]
        for peer in peers:
            pair = data.get(peer)
            if pair is None:
                cells.append("n/a")
                continue
            peer_value = unit(statistics.median(pair.peer))
            cells.append(f"**{pair.ratio:.2f}x** ({peer_value}{losses(peer)})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    def rate(value: float) -> str:
        return f"{value:,.0f}/s"

    def millis(value: float) -> str:
        return f"{value:.2f} ms"

    def micros(value: float) -> str:
        return f"{value:.0f} µs"

    row("uncontended acquire+release", results.uncontended, rate)
    row("protocol limit: our scripts on a raw socket (hiredis)", results.limit, rate)
    label = "protocol limit, raw vs raw: each library's own commands on a raw socket"
    row(label, results.raw, rate)
    for processes, contended in results.contended.items():
        label = f"{processes}-process contended, read-modify-write inside"
        row(label, contended, rate, results.lost[processes])
    row("wake-up p50, release -> waiter holds (lower is better)", results.wake, millis)
    row("server CPU per uncontended cycle (lower is better)", results.server_cpu, micros)
    row("asyncio uncontended (each library's asyncio lock)", results.asyncio, rate)
    label = f"asyncio {args.tasks}-task contended, read-modify-write inside"
    row(label, results.async_contended, rate, results.async_lost)
    if results.ceilings:
        ours = results.ceilings[OURS].per_core
        cells = [rate(ours)]
        for peer in peers:
            top = results.ceilings.get(peer)
            if top is None:
                cells.append("n/a")
                continue
            cells.append(f"**{ours / top.per_core:.2f}x** ({rate(top.per_core)})")
        label = "saturated server ceiling: cycles per second of one Redis core"
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def face_table(results: Results) -> str:
    """The Django face's rows: each ratio ours / peer (medians of paired blocks)."""
    lines = [
        "| where users stand (paired blocks) | django-rlock | peer | ratio |",
        "|---|---:|---:|---:|",
    ]
    for label, pair in results.face.items():
        ours, peer = statistics.median(pair.ours), statistics.median(pair.peer)
        lines.append(f"| {label} | {ours:,.0f}/s | {peer:,.0f}/s | **{pair.ratio:.2f}x** |")
    cpu = ", ".join(f"{way} {value:.0f} µs" for way, value in results.face_cpu.items())
    lines.append(f"\nClient CPU per cycle (process_time, the smallest of 7 blocks): {cpu}.")
    return "\n".join(lines)


def server_side_table(results: Results) -> str:
    """Per library, its own commands raw: the server's work per cycle, and its ceiling."""
    lines = [
        "| raw cycle (the library's own commands) | commands run (scripts' included) "
        "| server CPU µs per cycle | ceiling: cycles/s of one core | achieved (server busy) |",
        "|---|---:|---:|---:|---:|",
    ]
    for library, cost in results.raw_costs.items():
        top = results.ceilings[library]
        lines.append(
            f"| {library} | {cost.commands:.1f} | {cost.server_cpu_us:.1f} "
            f"| {top.per_core:,.0f} | {top.achieved:,.0f}/s ({top.busy:.0%}) |"
        )
    return "\n".join(lines)


def messages_line(results: Results) -> str:
    """Release messages our processes read per contended cycle (median block, range)."""
    parts = [
        f"{processes} processes {statistics.median(values):.2f} "
        f"({min(values):.2f}-{max(values):.2f})"
        for processes, values in results.messages.items()
        if values
    ]
    return (
        "Release messages read per contended cycle, all django-rlock processes together "
        "(1: one process woken per release; processes - 1: every waiting process): "
        + ", ".join(parts)
        + "."
    )


def cost_table(results: Results) -> str:
    lines = [
        "| one uncontended acquire+release | commands run (scripts' included) "
        "| EVALSHA µs/call | server CPU µs | µs at the client |",
        "|---|---:|---:|---:|---:|",
    ]
    for library, cost in results.costs.items():
        evalsha = f"{cost.evalsha_us:.1f}" if cost.evalsha_us else "-"
        lines.append(
            f"| {library} | {cost.commands:.1f} | {evalsha} | {cost.server_cpu_us:.0f} "
            f"| {cost.cycle_us:.0f} |"
        )
    floor = ", ".join(f"{name} {value:.0f} µs" for name, value in results.floor.items())
    lines.append(f"\nOne round trip through redis-py on this machine: {floor}.")
    return "\n".join(lines)


def chart(results: Results, args: argparse.Namespace, path: Path) -> None:
    """Bars of django-rlock's advantage over each peer (log scale, 1.0 = even)."""
    import matplotlib  # noqa: PLC0415 -- only the chart needs it

    matplotlib.use("svg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    def ratios(data: dict[str, Paired], latency: bool = False) -> dict[str, float]:
        # Higher is better on every bar: a latency or cost ratio is turned over.
        return {peer: 1 / pair.ratio if latency else pair.ratio for peer, pair in data.items()}

    django_redis = "django-redis cache.lock()"
    face_ratios = list(results.face.values())
    groups: list[tuple[str, dict[str, float]]] = [
        ("uncontended", ratios(results.uncontended)),
        ("raw vs raw\n(protocol)", ratios(results.raw)),
        *(
            (f"{processes}-process\ncontended", ratios(contended))
            for processes, contended in results.contended.items()
        ),
        ("wake-up p50\n(latency)", ratios(results.wake, latency=True)),
        ("server CPU\nper cycle", ratios(results.server_cpu, latency=True)),
        (
            "server\nceiling",
            {
                peer: results.ceilings[OURS].per_core / top.per_core
                for peer, top in results.ceilings.items()
                if peer != OURS
            },
        ),
        ("asyncio\nuncontended", ratios(results.asyncio)),
        (f"asyncio {args.tasks}-task\ncontended", ratios(results.async_contended)),
    ]
    if len(face_ratios) == len(face.ROWS):
        groups += [
            ("Django face\nwith rlock()", {django_redis: face_ratios[0].ratio}),
            ("Django face\n@locked", {django_redis: face_ratios[1].ratio}),
            ("lock object\nper cycle", {"redis-py Lock": face_ratios[2].ratio}),
        ]
    columns = [*PEERS, django_redis]
    figure, axes = plt.subplots(figsize=(14, 5))
    width = 0.8 / len(PEERS)
    for offset, peer in enumerate(columns):
        xs, heights = [], []
        for index, (_, data) in enumerate(groups):
            if peer in data:
                # django-redis is each face group's only bar: centred.
                shift = 0.0 if peer == django_redis else (offset - (len(PEERS) - 1) / 2) * width
                xs.append(index + shift)
                heights.append(data[peer])
        if not xs:
            continue
        bars = axes.bar(xs, heights, width, label=f"vs {peer}")
        axes.bar_label(bars, labels=[f"{height:.2f}x" for height in heights], fontsize=8)
    axes.axhline(1.0, color="black", linewidth=1)
    axes.set_yscale("log")
    axes.set_xticks(range(len(groups)), [label for label, _ in groups], fontsize=8)
    axes.set_ylabel("django-rlock / peer  (>1: django-rlock is better)")
    axes.set_title(
        "django-rlock against other Python Redis locks "
        f"(median of paired ratios, {os.cpu_count()}-core machine)"
    )
    axes.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="svg", metadata={"Date": None})
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pairs", type=int, default=15, help="uncontended pairs per peer")
    parser.add_argument("--cycles", type=int, default=300, help="cycles per uncontended block")
    parser.add_argument(
        "--processes",
        type=lambda text: [int(count) for count in text.split(",")],
        default=[4, 8],
        help="contending processes, one row each (comma-separated)",
    )
    parser.add_argument("--limit-pairs", type=int, default=9, help="protocol-limit pairs per peer")
    parser.add_argument("--cpu-pairs", type=int, default=5, help="server CPU pairs per peer")
    parser.add_argument("--seconds", type=float, default=1.5, help="length of a contended block")
    parser.add_argument("--contended-pairs", type=int, default=3, help="contended pairs per peer")
    parser.add_argument("--tasks", type=int, default=100, help="contending asyncio tasks")
    parser.add_argument("--rounds", type=int, default=15, help="wake-ups per latency block")
    parser.add_argument("--wake-pairs", type=int, default=4, help="wake-up pairs per peer")
    parser.add_argument(
        "--face-pairs", type=int, default=61, help="pairs per Django face row (short blocks)"
    )
    parser.add_argument("--face-cycles", type=int, default=50, help="cycles per face block")
    parser.add_argument(
        "--ceiling-processes", type=int, default=3, help="processes saturating the server"
    )
    parser.add_argument(
        "--ceiling-connections", type=int, default=64, help="connections per saturating process"
    )
    parser.add_argument(
        "--ceiling-seconds", type=float, default=2.0, help="length of a saturation run"
    )
    parser.add_argument(
        "--chart", type=Path, default=Path("docs/benchmark.svg"), help="where to write the chart"
    )
    args = parser.parse_args()
    started = time.monotonic()
    results = run(args)
    print(table(results, args))
    print()
    print(messages_line(results))
    print()
    print(face_table(results))
    print()
    print(server_side_table(results))
    print()
    print(cost_table(results))
    print()
    print(limiter_table(limiter_costs(1000)))
    chart(results, args, args.chart)
    print(f"\nChart: {args.chart}; the run took {time.monotonic() - started:.0f} s.")
    lost = sum(by_library.get(OURS, 0) for by_library in results.lost.values())
    lost += results.async_lost.get(OURS, 0)
    if lost:
        raise SystemExit(f"django-rlock lost {lost} updates under contention")


if __name__ == "__main__":
    main()
