"""The protocols themselves, raw against raw: each library's own commands on a bare socket.

``make bench`` (:mod:`benchmarks.locks`) prints these tables; ``python -m
benchmarks.serverside`` runs them alone on a fresh redis-server. For every
library the very commands one uncontended acquire+release sends (django-rlock's
ACQUIRE and RELEASE scripts with the keys and arguments the engine builds,
redis-py's ``SET NX PX`` and release script, python-redis-lock's ``SET NX EX``
and its unlock script, pottery's ``SET NX PX`` and its release script), each
packed by the same RESP packer, written with one ``sendall`` and parsed by one
``hiredis.Reader``: no client library around any of them.

* **Raw against raw** (:func:`raw_rate`): cycles per second on one connection,
  paired blocks as everywhere in the benchmark. The limit of each protocol as
  seen by one caller: two round trips and the server's work.
* **Saturated ceiling** (:func:`ceiling`): many connections at once (a few
  processes, each keeping ``connections`` sockets with one command in flight
  on each, every connection its own lock name), for ``seconds``; cycles per
  second of the server's CPU time (INFO cpu, user + system) is what one Redis
  core serves when it does nothing else. The server's busy share is reported
  beside it: on a 2-core machine the clients compete with the server, so the
  core is not always saturated, and the ceiling is read from its CPU time.
* **Commands and server CPU per cycle** (:func:`server_cost`): INFO
  commandstats (every command run, those inside scripts included) and INFO cpu
  around raw cycles; read from the live server, so a change of the scripts
  shows here without touching this file.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Barrier

import hiredis
import redis
import redis.lock
import redis_lock

from benchmarks.protocol_limit import _connect
from django_rlock.core._process.holder import describe
from django_rlock.core._protocol.calls import acquire_call, release_call
from django_rlock.core._protocol.lock import ACQUIRE, ALLOW_OOM, RELEASE
from django_rlock.core._protocol.names import LockKeys

OURS = "django-rlock"

# pottery's Redlock on one master: SET NX PX, and this release script (its own text).
POTTERY_RELEASE = """
                if redis.call('get', KEYS[1]) == ARGV[1] then
                    return redis.call('del', KEYS[1])
                else
                    return 0
                end
            """


def bulk(part: str | int | bytes) -> bytes:
    """One RESP bulk string."""
    data = part if isinstance(part, bytes) else str(part).encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def pack(*parts: str | int | bytes) -> bytes:
    """One command in RESP, as every raw cycle here packs it."""
    return b"*%d\r\n" % len(parts) + b"".join(bulk(part) for part in parts)


#: Stands for the one part of a call that changes from cycle to cycle (a
#: request id, a token): :func:`packer` packs the rest once.
VARYING = "\x00varying\x00"


def packer(*parts: str | int | bytes) -> Callable[[bytes], bytes]:
    """``pack(*parts)`` with :data:`VARYING` replaced by each call's value, the rest packed once.

    No Python but a join per call: the raw cycles measure the protocol, not
    the packing (and a library's own argument layout may change freely).
    """
    head, tail = pack(*parts).split(bulk(VARYING))
    return lambda value: b"".join((head, bulk(value), tail))


@dataclass
class RawLock:
    """One library's acquire and release of one lock name, as the bytes they send.

    ``acquire()`` and ``release()`` pack the next call (a fresh request id or
    token each cycle, as the library makes one); ``granted(reply)`` and
    ``released(reply)`` say whether the server answered as an uncontended
    cycle must.
    """

    acquire: Callable[[], bytes]
    release: Callable[[], bytes]
    granted: Callable[[object], bool]
    released: Callable[[object], bool]


#: Library -> factory(admin client, lock name) of its raw lock (scripts loaded by the factory).
RawFactory = Callable[[redis.Redis, str], RawLock]


def _ours(admin: redis.Redis, name: str) -> RawLock:
    acquire_sha = admin.script_load(ACQUIRE)
    release_sha = admin.script_load(ALLOW_OOM + RELEASE)
    keys = LockKeys.build("bench", name)
    owner = "0123456789abcdef0123456789abcdef:1"
    # The engine's own calls, a fresh request id each (what makes a resend safe).
    grant = acquire_call(
        keys, owner, ttl=30.0, waiter_id="", sleep=0.0, rid=VARYING, holder=describe()
    )
    give_back = release_call(keys, owner, "publish", VARYING)
    acquire_with = packer("EVALSHA", acquire_sha, len(grant.keys), *grant.keys, *grant.args)
    release_with = packer(
        "EVALSHA", release_sha, len(give_back.keys), *give_back.keys, *give_back.args
    )
    rids = itertools.count(1)

    def acquire() -> bytes:
        return acquire_with(b"%d" % next(rids))

    def release() -> bytes:
        return release_with(b"%d" % next(rids))

    return RawLock(acquire, release, lambda reply: isinstance(reply, list), lambda r: r == 0)


def _set_then_script(
    script: str | bytes, extra_keys: Callable[[str], list[str]], extra_args: list[str], *, ex: bool
) -> RawFactory:
    """A peer that acquires with ``SET NX`` (PX 30000, or EX 30) and releases with ``script``."""

    def factory(admin: redis.Redis, name: str) -> RawLock:
        sha = admin.script_load(script)
        tokens = itertools.count(1)
        token = b""
        expiry = ("EX", 30) if ex else ("PX", 30000)
        keys = [name, *extra_keys(name)]
        set_with = packer("SET", name, VARYING, "NX", *expiry)
        release_with = packer("EVALSHA", sha, len(keys), *keys, VARYING, *extra_args)

        def acquire() -> bytes:
            nonlocal token
            token = b"%032d" % next(tokens)  # a fresh token per grant, as the library makes
            return set_with(token)

        def release() -> bytes:
            return release_with(token)

        return RawLock(acquire, release, lambda reply: reply == b"OK", lambda r: r in (0, 1))

    return factory


#: Library -> its raw lock. python-redis-lock's release pushes on a signal list
#: (``lock-signal:<name>``, ``signal_expire`` 1000 ms, its defaults).
RAW: dict[str, RawFactory] = {
    OURS: _ours,
    "redis-py Lock": _set_then_script(
        redis.lock.Lock.LUA_RELEASE_SCRIPT, lambda name: [], [], ex=False
    ),
    "python-redis-lock": _set_then_script(
        redis_lock.UNLOCK_SCRIPT, lambda name: [f"lock-signal:{name}"], ["1000"], ex=True
    ),
    "pottery Redlock": _set_then_script(POTTERY_RELEASE, lambda name: [], [], ex=False),
}


class _Conn:
    """A raw connection: send bytes, read one reply with hiredis."""

    def __init__(self, url: str) -> None:
        self.sock: socket.socket = _connect(url)
        self.reader = hiredis.Reader()
        self.buffer = bytearray(65536)

    def send(self, packed: bytes) -> None:
        self.sock.sendall(packed)

    def reply(self) -> object:
        reply = self.reader.gets()
        while reply is False:
            count = self.sock.recv_into(self.buffer)
            if not count:
                raise ConnectionError("the server closed the connection")
            # hiredis reads any buffer; its stub says bytes only.
            self.reader.feed(self.buffer, 0, count)  # type: ignore[arg-type]
            reply = self.reader.gets()
        if isinstance(reply, hiredis.ReplyError):
            raise RuntimeError(reply)
        return reply

    def call(self, packed: bytes) -> object:
        self.send(packed)
        return self.reply()

    def close(self) -> None:
        self.sock.close()


def _cycle(conn: _Conn, lock: RawLock) -> None:
    granted = conn.call(lock.acquire())
    if not lock.granted(granted):
        raise RuntimeError(f"an uncontended acquire was not granted: {granted!r}")
    released = conn.call(lock.release())
    if not lock.released(released):
        raise RuntimeError(f"an uncontended release failed: {released!r}")


class RawBlocks:
    """Blocks of raw cycles per library on one connection each, to pair (see benchmarks.locks)."""

    def __init__(self, url: str, cycles: int) -> None:
        self.cycles = cycles
        admin = redis.Redis.from_url(url)
        self.locks = {library: make(admin, f"raw:{library}") for library, make in RAW.items()}
        admin.close()
        self.conns = {library: _Conn(url) for library in RAW}
        for library in RAW:
            for _ in range(20):
                _cycle(self.conns[library], self.locks[library])

    def block(self, library: str) -> float:
        """Cycles per second of ``library``'s raw commands over one block."""
        conn, lock = self.conns[library], self.locks[library]
        started = time.perf_counter()
        for _ in range(self.cycles):
            _cycle(conn, lock)
        return self.cycles / (time.perf_counter() - started)

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()


# -- commands and server CPU per cycle ---------------------------------------------------


def _server_cpu(admin: redis.Redis) -> float:
    cpu = admin.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def _commands(admin: redis.Redis) -> int:
    """Commands run since the last CONFIG RESETSTAT, the admin's own left out."""
    stats = admin.info("commandstats")
    return sum(
        int(stat["calls"])
        for name, stat in stats.items()
        if not name.startswith(("cmdstat_info", "cmdstat_config"))
    )


@dataclass
class Cost:
    """What one raw cycle costs the server."""

    commands: float
    server_cpu_us: float


def server_cost(url: str, library: str, cycles: int, blocks: int = 5) -> Cost:
    """Commands (INFO commandstats) and server CPU (INFO cpu) per raw cycle of ``library``.

    The CPU is the smallest of ``blocks`` blocks of ``cycles`` cycles (another
    program's work lands on the server's clock only as noise that adds).
    """
    admin = redis.Redis.from_url(url)
    lock = RAW[library](admin, f"cost:{library}")
    conn = _Conn(url)
    try:
        for _ in range(20):
            _cycle(conn, lock)
        cpu = []
        admin.config_resetstat()
        for _ in range(blocks):
            before = _server_cpu(admin)
            for _ in range(cycles):
                _cycle(conn, lock)
            cpu.append((_server_cpu(admin) - before) * 1e6 / cycles)
        commands = _commands(admin) / (cycles * blocks)
    finally:
        conn.close()
        admin.close()
    return Cost(commands=commands, server_cpu_us=min(cpu))


# -- the saturated ceiling -----------------------------------------------------------------


def _saturate(
    *,
    url: str,
    library: str,
    index: int,
    connections: int,
    seconds: float,
    barrier: Barrier,
    done: Synchronized[int],
) -> None:
    admin = redis.Redis.from_url(url)
    conns = [_Conn(url) for _ in range(connections)]
    locks = [RAW[library](admin, f"ceiling:{library}:{index}:{n}") for n in range(connections)]
    admin.close()
    cycles = 0
    barrier.wait(60)
    stop_at = time.monotonic() + seconds
    try:
        while time.monotonic() < stop_at:
            # One command in flight on every connection: the server finds them
            # all ready at once, as it does under many clients.
            for conn, lock in zip(conns, locks, strict=True):
                conn.send(lock.acquire())
            for conn, lock in zip(conns, locks, strict=True):
                if not lock.granted(conn.reply()):
                    raise RuntimeError("an uncontended acquire was not granted")
            for conn, lock in zip(conns, locks, strict=True):
                conn.send(lock.release())
            for conn, lock in zip(conns, locks, strict=True):
                if not lock.released(conn.reply()):
                    raise RuntimeError("an uncontended release failed")
            cycles += connections
    finally:
        for conn in conns:
            conn.close()
    with done.get_lock():
        done.value += cycles


@dataclass
class Ceiling:
    """One saturation run of a library."""

    #: Cycles per second of the server's CPU time: what one fully busy core serves.
    per_core: float
    #: Cycles per second of wall time achieved in the run.
    achieved: float
    #: The server's CPU time over the wall time (1.0: one core fully busy).
    busy: float


def ceiling(url: str, library: str, processes: int, connections: int, seconds: float) -> Ceiling:
    """``processes`` x ``connections`` raw connections cycling ``library``'s locks."""
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(processes + 1)
    done: Synchronized[int] = context.Value("l", 0)
    workers = [
        context.Process(
            target=_saturate,
            kwargs={
                "url": url,
                "library": library,
                "index": index,
                "connections": connections,
                "seconds": seconds,
                "barrier": barrier,
                "done": done,
            },
        )
        for index in range(processes)
    ]
    for worker in workers:
        worker.start()
    admin = redis.Redis.from_url(url)
    barrier.wait(60)
    before, started = _server_cpu(admin), time.monotonic()
    for worker in workers:
        worker.join(timeout=seconds + 60)
    # The server's clock stops with the last worker: its reply read, it stops sending.
    cpu, elapsed = _server_cpu(admin) - before, time.monotonic() - started
    admin.close()
    failed = [worker.exitcode for worker in workers if worker.exitcode != 0]
    if failed:
        raise RuntimeError(f"a saturating worker failed (exit codes {failed})")
    total = int(done.value)
    return Ceiling(per_core=total / cpu, achieved=total / elapsed, busy=cpu / elapsed)


def main() -> None:
    from benchmarks.locks import paired_between  # noqa: PLC0415 -- the shared pairing
    from tests.servers import RedisServer  # noqa: PLC0415 -- only the standalone run starts one

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--pairs", type=int, default=9)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    with RedisServer() as server:
        url = server.url
        blocks = RawBlocks(url, args.cycles)
        for peer in RAW:
            if peer == OURS:
                continue
            result = paired_between(blocks.block, OURS, peer, args.pairs)
            print(f"raw, {OURS} / {peer}: {result.ratio:.2f}x")
        blocks.close()
        for library in RAW:
            cost = server_cost(url, library, 1000)
            top = ceiling(url, library, args.processes, args.connections, args.seconds)
            print(
                f"{library}: {cost.commands:.1f} commands, {cost.server_cpu_us:.1f} µs server CPU "
                f"per cycle; ceiling {top.per_core:,.0f}/s per core "
                f"({top.achieved:,.0f}/s achieved, server {top.busy:.0%} busy)"
            )


if __name__ == "__main__":
    main()
