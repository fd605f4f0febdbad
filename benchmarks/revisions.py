"""Before and after: the uncontended cycle of two or more revisions, side by side in one run.

``python -m benchmarks.revisions main HEAD`` checks each revision out into a
temporary ``git worktree`` (removed at the end; a path to a source tree is
taken as it is), starts one worker process per revision, each importing its
own tree's ``django_rlock``, and runs blocks of cycles against one
redis-server, the revisions' order alternating from pair to pair. Each worker
also runs the peer of each row (redis-py's ``Lock``, sync and asyncio;
django-redis's ``cache.lock()`` for the Django face), so each revision's ratio
to its peer is measured beside it.

Rows: ``sync`` (one ``RLock``, acquire+release), ``aio`` (one ``AsyncRLock``,
``async with``), ``rlock`` (``with rlock(name)`` in a view's unit of work,
:mod:`benchmarks.face`), ``engine-object`` (``with client.lock(name)``, a lock
object per cycle). Printed per revision: the median cycles/s, the least client
CPU per cycle (``process_time``), the median ratio to its peer, and the median
of the per-pair ratios to the first revision: the number to read on a shared
machine, where absolute rates move with the load.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: Row -> the peer each worker runs beside it.
PEERS = {
    "sync": "redis-py",
    "aio": "redis-py-aio",
    "rlock": "django-redis",
    "engine-object": "redis-py-object",
}


def _worker_ways(url: str, tag: str, rows: list[str]) -> dict[str, Callable[[int], None]]:
    """In a worker: each row and its peer as ``run(cycles)``, built on this tree's library."""
    import redis  # noqa: PLC0415 -- the worker's own imports, from its tree
    import redis.asyncio  # noqa: PLC0415

    from django_rlock.core import LockClient  # noqa: PLC0415
    from django_rlock.core.aio import AsyncLockClient  # noqa: PLC0415

    loop = asyncio.new_event_loop()

    def cycles(acquire: Callable[[], Any], release: Callable[[], Any]) -> Callable[[int], None]:
        def run(count: int) -> None:
            for _ in range(count):
                acquire()
                release()

        return run

    def async_cycles(lock: Any) -> Callable[[int], None]:
        async def block(count: int) -> None:
            for _ in range(count):
                async with lock:
                    pass

        return lambda count: loop.run_until_complete(block(count))

    ways: dict[str, Callable[[int], None]] = {}
    if "sync" in rows:
        ours = LockClient(url, key_prefix=f"rev{tag}").lock("sync")
        peer = redis.Redis.from_url(url).lock(f"rev{tag}:redis-py", timeout=30)
        ways["sync"] = cycles(ours.acquire, ours.release)
        ways["redis-py"] = cycles(peer.acquire, peer.release)
    if "aio" in rows:
        ways["aio"] = async_cycles(AsyncLockClient(url, key_prefix=f"rev{tag}").lock("aio"))
        ways["redis-py-aio"] = async_cycles(
            redis.asyncio.Redis.from_url(url).lock(f"rev{tag}:redis-py-aio", timeout=30)
        )
    if {"rlock", "engine-object"} & set(rows):
        from benchmarks.face import FaceBlocks  # noqa: PLC0415 -- configures Django

        face = FaceBlocks(url, 1)
        for way in ("rlock", "django-redis", "engine-object", "redis-py-object"):
            run_once = face.ways[way]

            def run(count: int, run_once: Callable[[], None] = run_once) -> None:
                for _ in range(count):
                    run_once()

            ways[way] = run
    return ways


def worker(url: str, tag: str, rows: list[str]) -> None:
    """Serve ``<way> <cycles>`` lines on stdin: print cycles/s and CPU µs per cycle."""
    ways = _worker_ways(url, tag, rows)
    for run in ways.values():
        run(50)  # connected, scripts loaded
    print("ready", flush=True)
    for line in sys.stdin:
        way, count = line.split()
        cpu, wall = time.process_time(), time.perf_counter()
        ways[way](int(count))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(int(count) / wall, cpu / int(count) * 1e6, flush=True)


@contextmanager
def trees(revisions: list[str]) -> Iterator[dict[str, Path]]:
    """Each revision's source tree: a temporary worktree (removed after), or a path as given."""
    made: list[Path] = []
    found: dict[str, Path] = {}
    scratch = Path(tempfile.mkdtemp(prefix="rlock-revisions-"))
    try:
        for index, revision in enumerate(revisions):
            if Path(revision).is_dir():
                found[revision] = Path(revision).resolve()
                continue
            path = scratch / f"{index}"
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), revision],
                check=True,
                capture_output=True,
            )
            made.append(path)
            found[revision] = path
        yield found
    finally:
        for path in made:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
                check=False,
                capture_output=True,
            )
        os.rmdir(scratch)


class Worker:
    """One revision's worker process."""

    def __init__(self, path: Path, url: str, tag: str, rows: list[str]) -> None:
        # This file runs as a script (an old revision may not have it); the
        # library, and benchmarks.face, come from the revision's tree.
        env = dict(os.environ, PYTHONPATH=str(path))
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--worker", url, tag, ",".join(rows)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tempfile.gettempdir(),
        )
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.stdin, self.stdout = self.process.stdin, self.process.stdout
        ready = self.stdout.readline().strip()
        if ready != "ready":
            raise RuntimeError(f"the worker of {path} did not start: {ready!r}")

    def block(self, way: str, cycles: int) -> tuple[float, float]:
        self.stdin.write(f"{way} {cycles}\n")
        self.stdin.flush()
        rate, cpu = self.stdout.readline().split()
        return float(rate), float(cpu)

    def close(self) -> None:
        self.stdin.close()
        self.process.wait(timeout=60)


def compare(paths: dict[str, Path], rows: list[str], pairs: int, cycles: int) -> None:
    from tests.servers import RedisServer  # noqa: PLC0415 -- only the driver starts one

    with RedisServer() as server:
        workers = {
            name: Worker(path, server.url, str(index), rows)
            for index, (name, path) in enumerate(paths.items())
        }
        try:
            names = list(workers)
            first = names[0]
            for row in rows:
                peer = PEERS[row]
                rates: dict[str, list[float]] = {name: [] for name in names}
                cpus: dict[str, list[float]] = {name: [] for name in names}
                to_peer: dict[str, list[float]] = {name: [] for name in names}
                to_first: dict[str, list[float]] = {name: [] for name in names}
                for index in range(pairs):
                    order = names if index % 2 == 0 else names[::-1]
                    for name in order:
                        rate, cpu = workers[name].block(row, cycles)
                        peer_rate, _ = workers[name].block(peer, cycles)
                        rates[name].append(rate)
                        cpus[name].append(cpu)
                        to_peer[name].append(rate / peer_rate)
                    for name in names:
                        to_first[name].append(rates[name][-1] / rates[first][-1])
                for name in names:
                    print(
                        f"{row:13} {name:>12}: {statistics.median(rates[name]):7,.0f}/s, "
                        f"client CPU {min(cpus[name]):5.1f} µs/cycle, "
                        f"{statistics.median(to_peer[name]):.3f}x {peer}, "
                        f"{statistics.median(to_first[name]):.3f}x {first}",
                        flush=True,
                    )
        finally:
            for each in workers.values():
                each.close()


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        url, tag, rows = sys.argv[2:5]
        worker(url, tag, rows.split(","))
        return
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("revisions", nargs="+", help="git revisions or source tree paths")
    parser.add_argument("--rows", default="sync,aio,rlock,engine-object", help="comma-separated")
    parser.add_argument("--pairs", type=int, default=15, help="blocks per revision and row")
    parser.add_argument("--cycles", type=int, default=300, help="cycles per block")
    args = parser.parse_args()
    rows = args.rows.split(",")
    unknown = set(rows) - set(PEERS)
    if unknown:
        parser.error(f"unknown rows {sorted(unknown)}; rows are {sorted(PEERS)}")
    with trees(args.revisions) as paths:
        compare(paths, rows, args.pairs, args.cycles)


if __name__ == "__main__":
    main()
