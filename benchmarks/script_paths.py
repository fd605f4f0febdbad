"""The plain lock's scripts path by path, on the server: two or more revisions side by side.

``python -m benchmarks.script_paths . main`` loads each revision's ACQUIRE
and RELEASE (as rendered in its ``docs/lua/lock.*.lua``; ``.`` is this tree's
:mod:`django_rlock.core._protocol.lock`, a directory is read as a rendered
``docs/lua``) into one freshly started redis-server and, on one raw socket
per revision, runs the four paths of an uncontended cycle over a few hundred
lock names, one path at a time (a phase), each call after the reply to the
one before:

* **fresh grant**: ACQUIRE of a free lock; **re-entry**: ACQUIRE by the
  owner already holding it;
* **inner release**: the RELEASE of that re-entry (the outer hold kept);
  **final release**: the RELEASE that frees the lock, no waiter.

A phase's time on the server is read from INFO commandstats (the time Redis
measures around each EVALSHA, the script's own commands included), reset
before each phase. Blocks of phases alternate between revisions, the order
reversed from round to round; printed: each path's median over blocks of the
mean µs per call, and the ratio of each revision to the first, block by block
(the median of the ratios). Where the server's time goes, path by path: the
tool to read before and after a change to the plain lock's Lua.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import statistics
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import redis

from benchmarks.protocol_limit import _bulk, _caller, _connect, _evalsha_head
from django_rlock.core._process.holder import describe
from django_rlock.core._protocol.calls import acquire_call, release_call
from django_rlock.core._protocol.lock import ACQUIRE, ALLOW_OOM, RELEASE
from django_rlock.core._protocol.names import LockKeys
from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent

#: The paths of one cycle, in the order they are sent.
PATHS = ("fresh grant", "re-entry", "inner release", "final release")

#: An owner id of the shape an RLock sends (a UUID, ':', a thread number).
OWNER = "0b6c8a6e-3f5d-4a8e-9c61-2d4f7b1e9a30:1"


def scripts_of(revision: str) -> tuple[str, str]:
    """ACQUIRE and RELEASE (with its allow-oom line) of ``revision`` ('.': this tree)."""
    if revision == ".":
        return ACQUIRE, ALLOW_OOM + RELEASE
    if Path(revision).is_dir():
        rendered = Path(revision)
        return (
            (rendered / "lock.acquire.lua").read_text(),
            ALLOW_OOM + (rendered / "lock.release.lua").read_text(),
        )

    def shown(kind: str) -> str:
        return subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{revision}:docs/lua/lock.{kind}.lua"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    return shown("acquire"), ALLOW_OOM + shown("release")


class Calls(NamedTuple):
    """One revision's calls on its lock names, each packed as an RLock sends it."""

    call: Callable[[bytes], object]
    acquires: list[Callable[[int], bytes]]
    releases: list[Callable[[int], bytes]]


def calls_of(url: str, admin: redis.Redis, tag: int, revision: str, names: int) -> Calls:
    """The calls of ``revision``'s scripts on ``names`` lock names of its own."""
    acquire_lua, release_lua = scripts_of(revision)
    acquire_sha, release_sha = admin.script_load(acquire_lua), admin.script_load(release_lua)
    holder = describe()
    acquires: list[Callable[[int], bytes]] = []
    releases: list[Callable[[int], bytes]] = []
    for index in range(names):
        keys = LockKeys.build("rlock", f"order:{tag:02d}{index:05d}")
        sample = acquire_call(
            keys, OWNER, ttl=30.0, waiter_id="", sleep=0.0, rid="0", holder=holder
        )
        free = release_call(keys, OWNER, "publish", "0")
        acquire_head = (
            _evalsha_head(acquire_sha, 3 + len(sample.keys) + len(sample.args))
            + _bulk(len(sample.keys))
            + b"".join(_bulk(key) for key in sample.keys)
            + b"".join(_bulk(arg) for arg in sample.args[:4])
        )
        acquire_tail = b"".join(_bulk(arg) for arg in sample.args[5:])
        release_head = (
            _evalsha_head(release_sha, 3 + len(free.keys) + len(free.args))
            + _bulk(len(free.keys))
            + b"".join(_bulk(key) for key in free.keys)
            + b"".join(_bulk(arg) for arg in free.args[:2])
        )
        acquires.append(functools.partial(_with_rid, acquire_head, acquire_tail))
        releases.append(functools.partial(_with_rid, release_head, b""))
    return Calls(_caller(_connect(url)), acquires, releases)


def _with_rid(head: bytes, tail: bytes, rid: int) -> bytes:
    # A call packed but for its request id, which every send makes new.
    return head + _bulk(rid) + tail


def _evalsha_usec(admin: redis.Redis) -> float:
    stat = admin.info("commandstats").get("cmdstat_evalsha", {"usec": 0})
    return float(stat["usec"])


def block(admin: redis.Redis, calls: Calls, rids: itertools.count[int]) -> dict[str, float]:
    """Mean server µs per call of each path, each path a phase over every name (commandstats)."""
    send, count = calls.call, len(calls.acquires)
    took: dict[str, float] = {}

    def phase(path: str, made: list[Callable[[int], bytes]], reply: object) -> None:
        admin.config_resetstat()
        for make in made:
            answer = send(make(next(rids)))
            assert answer == reply if reply is not None else isinstance(answer, list), answer
        took[path] = _evalsha_usec(admin) / count

    phase("fresh grant", calls.acquires, None)
    phase("re-entry", calls.acquires, None)
    phase("inner release", calls.releases, 1)
    phase("final release", calls.releases, 0)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revisions", nargs="+", help="git revisions, or '.' for this tree")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--cycles", type=int, default=250)
    args = parser.parse_args()
    with RedisServer() as server:
        admin = redis.Redis.from_url(server.url)
        ways = {
            f"{tag}:{revision}": calls_of(server.url, admin, tag, revision, args.cycles)
            for tag, revision in enumerate(args.revisions)
        }
        rids = itertools.count(1)
        for way in ways.values():
            block(admin, way, rids)  # connected, scripts warm, every name's latches there
        measured: dict[str, list[dict[str, float]]] = {revision: [] for revision in ways}
        for round_ in range(args.rounds):
            order = list(ways) if round_ % 2 == 0 else list(reversed(ways))
            for revision in order:
                measured[revision].append(block(admin, ways[revision], rids))
    labels = list(measured)
    first = labels[0]
    print(
        f"server µs per call (commandstats), median of {args.rounds} blocks of {args.cycles} cycles"
    )
    print(f"{'path':16s}" + "".join(f"{label[-12:]:>14s}" for label in labels))
    for path in (*PATHS, "cycle (4 calls)"):

        def value(row: dict[str, float], path: str = path) -> float:
            return sum(row.values()) if path.startswith("cycle") else row[path]

        cells = []
        for revision in labels:
            mine = statistics.median(value(row) for row in measured[revision])
            ratio = statistics.median(
                value(row) / value(base)
                for row, base in zip(measured[revision], measured[first], strict=True)
            )
            cells.append(f"{mine:7.2f} {ratio:5.2f}x")
        print(f"{path:16s}" + "".join(f"{cell:>14s}" for cell in cells))


if __name__ == "__main__":
    main()
