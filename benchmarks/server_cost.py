"""What the server pays for a lock: commands and CPU per cycle, bytes per lock and per name.

Side by side, in one run, on one freshly started redis-server, each cycle (one
uncontended acquire and its release) sent on a raw socket exactly as its
library sends it, so that only the server's side differs:

* **django-rlock**: the plain lock's ACQUIRE and RELEASE, with the keys and
  arguments an ``RLock`` sends (:mod:`~django_rlock.core._protocol.calls`, a
  fresh request id per call, the real holder description);
* **django-rlock, layout="redisson"**: its scripts on Redisson's keys;
* **Redisson RLock**: Redisson's own ``tryLock`` and ``unlock`` scripts and the
  DEL of its unlock latch that follows every unlock, as a Java client sends
  them. The scripts are the Redisson emulator's verbatim copies, found where the
  interop tests find it (``tests/interop/conftest.py``: ``REDISSON_EMULATOR_DIR``);
  without it, these rows are left out and the run says so.

Per cycle: the commands the server ran (INFO commandstats; the scripts' own
commands included), the µs its EVALSHA calls took (commandstats), and the
server's CPU time (INFO cpu, user + system: socket I/O and protocol parsing
included), each block of cycles measured alone. CPU is compared as the other
benchmarks compare speed: blocks in pairs, one of django-rlock and one of the
peer back to back, the order alternating; the ratio is the median of the pairs'
ratios. Memory: ``MEMORY USAGE`` of every key while a lock is held, and of what
its name leaves once released.

Run alone: ``python -m benchmarks.server_cost`` (``make bench`` runs it too).
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import redis

from benchmarks.protocol_limit import _bulk, _caller, _connect, _evalsha_head, our_calls
from django_rlock.core._process.holder import describe
from django_rlock.core._protocol import redisson as redisson_layout
from django_rlock.core._protocol.calls import acquire_call, release_call
from django_rlock.core._protocol.lock import ALLOW_OOM
from django_rlock.core._protocol.names import LockKeys
from tests.servers import RedisServer

OURS = "django-rlock"
OURS_REDISSON = 'django-rlock layout="redisson"'
REDISSON = "Redisson RLock (its scripts)"

#: The name every cycle locks (the footprint test's, of the size users write).
NAME = "order:12345"

#: An owner id of the shape every library here uses: a UUID, ':', a thread number.
OWNER = "0b6c8a6e-3f5d-4a8e-9c61-2d4f7b1e9a30:1"

#: Redisson's lockWatchdogTimeout and unlockLatchTimeout defaults, in ms.
REDISSON_LEASE_MS, REDISSON_LATCH_MS = 30_000, 20_000


def redisson_emulator() -> ModuleType | None:
    """The Redisson emulator module, found as the interop tests find it; None if absent."""
    from tests.interop.conftest import EMULATOR_DIR  # noqa: PLC0415 -- imports pytest

    if EMULATOR_DIR is None:
        return None
    if str(EMULATOR_DIR) not in sys.path:
        sys.path.insert(0, str(EMULATOR_DIR))
    return importlib.import_module("redisson_emulator")


class Cycle:
    """One library's acquire+release, on a raw socket of its own, and its lock held alone."""

    def __init__(self, url: str, send: Callable[[Callable[[bytes], object]], None]) -> None:
        self.sock = _connect(url)
        self.call = _caller(self.sock)
        self._send = send

    def run(self, cycles: int) -> None:
        """``cycles`` acquire+release cycles."""
        for _ in range(cycles):
            self._send(self.call)

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()


def ours(url: str) -> Cycle:
    """The plain lock's cycle, as an ``RLock`` of the default layout sends it."""
    calls = our_calls(url, LockKeys.build("rlock", NAME), OWNER)
    rids = itertools.count(1)

    def acquire(call: Callable[[bytes], object]) -> None:
        assert isinstance(call(calls.acquire(next(rids))), list)

    def release(call: Callable[[bytes], object]) -> None:
        assert call(calls.release(next(rids))) == 0

    def send(call: Callable[[bytes], object]) -> None:
        acquire(call)
        release(call)

    return Cycle(url, send)


def ours_redisson(url: str) -> Cycle:
    """The plain lock's cycle in Redisson's layout (this library's scripts on its keys)."""
    admin = redis.Redis.from_url(url)
    acquire_sha = admin.script_load(redisson_layout.ACQUIRE)
    release_sha = admin.script_load(ALLOW_OOM + redisson_layout.RELEASE)
    admin.close()
    keys = redisson_layout.redisson_keys("rlock", NAME)
    holder = describe()
    rids = itertools.count(1)

    def send(call: Callable[[bytes], object]) -> None:
        plain = acquire_call(
            keys, OWNER, ttl=30.0, waiter_id="", sleep=0.0, rid=str(next(rids)), holder=holder
        )
        grant = redisson_layout.acquire_on(keys, OWNER, plain)
        assert isinstance(call(_evalsha(acquire_sha, grant.keys, grant.args)), list)
        free = redisson_layout.release_on(
            keys, OWNER, release_call(keys, OWNER, "publish", str(next(rids)))
        )
        assert call(_evalsha(release_sha, free.keys, free.args)) == 0

    return Cycle(url, send)


def redisson(url: str, emu: ModuleType) -> Cycle:
    """Redisson's RLock cycle: ``tryLock``, ``unlock``, then the DEL of the unlock latch."""
    admin = redis.Redis.from_url(url)
    lock_sha = admin.script_load(emu.LOCK_TRY_LOCK)
    unlock_sha = admin.script_load(emu.LOCK_UNLOCK)
    admin.close()
    channel = emu.prefix_name("redisson_lock__channel", NAME)
    ids = itertools.count(1)

    def send(call: Callable[[bytes], object]) -> None:
        assert call(_evalsha(lock_sha, [NAME], [REDISSON_LEASE_MS, OWNER])) is None
        # RedissonBaseLock.unlockAsync: a random request id names the latch, deleted after.
        latch = emu.prefix_name("redisson_unlock_latch", NAME) + ":" + f"{next(ids):032x}"
        args = [emu.UNLOCK_MESSAGE, REDISSON_LEASE_MS, OWNER, "publish", REDISSON_LATCH_MS]
        assert call(_evalsha(unlock_sha, [NAME, channel, latch], args)) == 1
        assert call(b"*2\r\n$3\r\nDEL\r\n" + _bulk(latch)) == 1

    return Cycle(url, send)


def _evalsha(sha: str, keys: list[str], args: list[str | int]) -> bytes:
    return (
        _evalsha_head(sha, 3 + len(keys) + len(args))
        + _bulk(len(keys))
        + b"".join(_bulk(key) for key in keys)
        + b"".join(_bulk(arg) for arg in args)
    )


@dataclass
class Block:
    """One block of cycles as the server saw it, per cycle."""

    commands: float  # every command run, the scripts' own included
    evalsha_us: float  # commandstats' usec of EVALSHA (the scripts, their commands included)
    cpu_us: float  # INFO cpu, user + system


def _server_cpu(admin: redis.Redis) -> float:
    cpu = admin.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def block(admin: redis.Redis, cycle: Cycle, cycles: int) -> Block:
    """Run ``cycles`` cycles and read what the server spent on them."""
    admin.config_resetstat()
    before = _server_cpu(admin)
    cycle.run(cycles)
    cpu = _server_cpu(admin) - before
    stats = admin.info("commandstats")
    ran = sum(
        int(stat["calls"])
        for name, stat in stats.items()
        if not name.startswith(("cmdstat_info", "cmdstat_config"))
    )
    evalsha = stats.get("cmdstat_evalsha", {})
    return Block(
        commands=ran / cycles,
        evalsha_us=float(evalsha.get("usec", 0)) / cycles,
        cpu_us=cpu * 1e6 / cycles,
    )


@dataclass
class Row:
    """One library's measures, medians over the blocks."""

    commands: float
    evalsha_us: float
    cpu_us: float
    cpu_ratio: float | None  # ours / this one, median of the pairs (None: ours itself)
    held_bytes: int
    left_bytes: int


def measure_memory(url: str, library: str, emu: ModuleType | None) -> tuple[int, int]:
    """Bytes kept while ``library`` holds one lock, and left by its name once released."""
    admin = redis.Redis.from_url(url)
    admin.flushall()
    if library == OURS:
        cycle = ours(url)
    elif library == OURS_REDISSON:
        cycle = ours_redisson(url)
    else:
        assert emu is not None
        cycle = redisson(url, emu)
    held_seen: list[int] = []

    def sizes() -> int:
        return sum(int(admin.memory_usage(key, samples=0) or 0) for key in admin.keys("*"))

    original = cycle.call

    def spy(packed: bytes) -> object:
        reply = original(packed)
        if not held_seen:
            held_seen.append(sizes())  # right after the acquire: the lock held
        return reply

    cycle.call = spy
    cycle.run(1)
    cycle.close()
    left = sizes()
    admin.flushall()
    admin.close()
    return held_seen[0], left


def run(args: argparse.Namespace) -> tuple[dict[str, Row], str | None]:
    """Every row, on one fresh server; the second value says why Redisson's row is missing."""
    emu = redisson_emulator()
    with RedisServer() as server:
        url = server.url
        admin = server.client()
        version = str(admin.info("server")["redis_version"])
        cycles: dict[str, Cycle] = {OURS: ours(url), OURS_REDISSON: ours_redisson(url)}
        if emu is not None:
            cycles[REDISSON] = redisson(url, emu)
        for cycle in cycles.values():
            cycle.run(50)  # connected, scripts loaded, allocations warm
        blocks: dict[str, list[Block]] = {library: [] for library in cycles}
        ratios: dict[str, list[float]] = {library: [] for library in cycles if library != OURS}
        for pair in range(args.pairs):
            for peer, peer_ratios in ratios.items():
                order = [OURS, peer] if pair % 2 == 0 else [peer, OURS]
                measured = {
                    library: block(admin, cycles[library], args.cycles) for library in order
                }
                for library, result in measured.items():
                    blocks[library].append(result)
                peer_ratios.append(measured[OURS].cpu_us / measured[peer].cpu_us)
        for cycle in cycles.values():
            cycle.close()
        rows = {}
        for library, seen in blocks.items():
            held, left = measure_memory(url, library, emu)
            rows[library] = Row(
                commands=statistics.median(b.commands for b in seen),
                evalsha_us=statistics.median(b.evalsha_us for b in seen),
                cpu_us=statistics.median(b.cpu_us for b in seen),
                cpu_ratio=statistics.median(ratios[library]) if library in ratios else None,
                held_bytes=held,
                left_bytes=left,
            )
        admin.close()
    missing = None if emu is not None else "the Redisson emulator was not found"
    return rows, f"redis-server {version}" + (f"; {missing}" if missing else "")


def table(rows: dict[str, Row], note: str) -> str:
    """The markdown table of ``rows``."""
    lines = [
        "| one uncontended acquire+release | commands run (scripts' included) "
        "| EVALSHA µs | server CPU µs | django-rlock's CPU / this one "
        "| bytes while held | bytes left after release |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for library, row in rows.items():
        ratio = "-" if row.cpu_ratio is None else f"{row.cpu_ratio:.2f}x"
        lines.append(
            f"| {library} | {row.commands:.0f} | {row.evalsha_us:.1f} | {row.cpu_us:.1f} "
            f"| {ratio} | {row.held_bytes} | {row.left_bytes} |"
        )
    lines.append(
        f"\n{note}; name {NAME!r}; CPU ratio: the median of the pairs' ratios. Redisson's "
        "unlock latch is deleted by its client after every unlock (its third command); "
        "what django-rlock leaves after a release lives one minute."
    )
    return "\n".join(lines)


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=11, help="block pairs per peer")
    parser.add_argument("--cycles", type=int, default=3000, help="cycles per block")
    args = parser.parse_args()
    rows, note = run(args)
    print(table(rows, note or ""))


if __name__ == "__main__":
    main()
