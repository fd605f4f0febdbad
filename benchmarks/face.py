"""Where Django users stand: ``with rlock()`` and ``@locked`` against django-redis's lock.

``make bench`` (:mod:`benchmarks.locks`) prints these rows beside the engine's;
``python -m benchmarks.face`` runs them alone on a fresh redis-server
(``--profile`` adds a cProfile of one ``with rlock()`` block per cycle).

Django is configured in this process as a project would be: ``RLOCKS`` with
one alias on the benchmark's server (every setting at its default:
``TRANSACTION="auto"``, ``LEAKED="release"``, the reporter and the hold times
on), a SQLite database whose connection is open (so the end of every block
asks whether a transaction is open, as in a view), and django-redis's
``RedisCache`` on the same server as the ``default`` cache. Every block runs
inside a unit of work (what a request is: :func:`~django_rlock.core._process.leaks.work_started`),
so each hold is also filed in its scope.

Rows, each a series of paired blocks (see :mod:`benchmarks.locks`), short
ones (61 pairs of 50 cycles): on a loaded machine a burst then spoils one short
pair, not a long block:

* ``with rlock(name)`` against django-redis's ``with cache.lock(name)``: each
  makes a lock object per block, as a view does;
* a function decorated ``@locked("face:{item}")`` against the same;
* a lock object per cycle on the engine (``with client.lock(name)``) against
  redis-py's (``with redis.lock(name, timeout=30)``): what the face's object
  per block costs without Django.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from collections.abc import Callable
from typing import Any, cast

import redis

#: The rows: (label, ours, peer) keys of :class:`FaceBlocks`.
ROWS = (
    ("`with rlock(name)` vs django-redis `with cache.lock(name)`", "rlock", "django-redis"),
    ("`@locked(template)` call vs django-redis `with cache.lock(name)`", "locked", "django-redis"),
    ("lock object per cycle: engine vs redis-py `Lock`", "engine-object", "redis-py-object"),
)


def configure(url: str) -> None:
    """Configure Django for the face's blocks (once per process)."""
    import django  # noqa: PLC0415 -- only the face's rows need Django
    from django.conf import settings  # noqa: PLC0415

    if settings.configured:
        return
    settings.configure(
        INSTALLED_APPS=["django_rlock"],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        RLOCKS={"default": {"LOCATION": url, "KEY_PREFIX": "face"}},
        CACHES={"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url}},
        USE_TZ=True,
    )
    django.setup()


class FaceBlocks:
    """Blocks of ``cycles`` lock cycles per way of locking, to pair."""

    def __init__(self, url: str, cycles: int) -> None:
        configure(url)
        from django.core.cache import cache  # noqa: PLC0415 -- Django is configured now
        from django.db import connections  # noqa: PLC0415

        from django_rlock import locked, rlock  # noqa: PLC0415
        from django_rlock.core import LockClient  # noqa: PLC0415
        from django_rlock.core._process import leaks  # noqa: PLC0415

        connections["default"].ensure_connection()  # a view's connection is open
        leaks.work_started("request")  # every block inside a unit of work, as in a view
        self.cycles = cycles
        client = LockClient(url, key_prefix="face-engine")
        peer = redis.Redis.from_url(url)

        def with_rlock() -> None:
            with rlock("face:rlock"):
                pass

        @locked("face:{item}")
        def decorated(item: int) -> None:
            pass

        def with_locked() -> None:
            decorated(1)

        def with_cache_lock() -> None:
            with cast(Any, cache).lock("face:cache"):  # django-redis's RedisCache
                pass

        def engine_object() -> None:
            with client.lock("face:engine"):
                pass

        def redis_py_object() -> None:
            with peer.lock("face:redis-py", timeout=30):
                pass

        self.ways: dict[str, Callable[[], None]] = {
            "rlock": with_rlock,
            "locked": with_locked,
            "django-redis": with_cache_lock,
            "engine-object": engine_object,
            "redis-py-object": redis_py_object,
        }
        for way in self.ways.values():
            for _ in range(20):
                way()  # connected, scripts loaded

    def block(self, way: str) -> float:
        """Cycles per second of ``way`` over one block."""
        run = self.ways[way]
        started = time.perf_counter()
        for _ in range(self.cycles):
            run()
        return self.cycles / (time.perf_counter() - started)

    def client_cpu_us(self, way: str, blocks: int = 7) -> float:
        """The client's CPU µs per cycle of ``way``: ``process_time``, the least of ``blocks``."""
        run = self.ways[way]
        best = float("inf")
        for _ in range(blocks):
            started = time.process_time()
            for _ in range(self.cycles):
                run()
            best = min(best, (time.process_time() - started) / self.cycles)
        return best * 1e6

    def profile(self, way: str, cycles: int = 3000) -> None:
        """Print a cProfile of ``cycles`` cycles of ``way`` and the Python calls per cycle."""
        run = self.ways[way]
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(cycles):
            run()
        profiler.disable()
        stats = pstats.Stats(profiler)
        stats.sort_stats("tottime").print_stats(25)
        print(f"{stats.total_calls / cycles:.0f} Python function calls per cycle")  # type: ignore[attr-defined]


def main() -> None:
    from benchmarks.locks import paired_between  # noqa: PLC0415 -- the shared pairing
    from tests.servers import RedisServer  # noqa: PLC0415 -- only the standalone run starts one

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pairs", type=int, default=61)
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    with RedisServer() as server:
        blocks = FaceBlocks(server.url, args.cycles)
        if args.profile:
            blocks.profile("rlock")
        for label, ours, peer in ROWS:
            result = paired_between(blocks.block, ours, peer, args.pairs)
            print(
                f"{label}: {result.ratio:.2f}x ({statistics.median(result.ours):,.0f}/s "
                f"against {statistics.median(result.peer):,.0f}/s)"
            )
        for way in blocks.ways:
            print(f"client CPU per cycle, {way}: {blocks.client_cpu_us(way):.0f} µs")


if __name__ == "__main__":
    main()
