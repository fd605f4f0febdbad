"""What ``maxmemory-policy volatile-lru`` does to held locks under memory pressure.

One holder thread takes :data:`LOCKS` locks (watchdog leases). Then a memory
spike: keys with no TTL are written until Redis refuses them (OOM), so Redis
evicts what it may, keys with a TTL, that is every lock key; the spike then
ends (the ballast is deleted). A rival thread tries every lock once right
away, and again until each evicted lock is its own. Counted: the lock keys
evicted, the evicted locks the rival held before their holder was told (its
``on_lost`` callback), and how long the holders took to be told.

``python -m tests.faults.eviction_scenario [RUNS]`` prints one line per run
(the numbers docs/guarantees.md quotes); ``tests/faults/test_eviction.py``
runs it once.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from dataclasses import dataclass, field

import redis

from django_rlock.core import LockClient, LockLostError, LockOutOfMemoryError
from django_rlock.core._sync.locks import RLock
from tests.servers import RedisServer

#: Locks held when the spike comes.
LOCKS = 50
#: The holder's watchdog timeout (renewals every WATCHDOG / 3 seconds).
WATCHDOG = 3.0
#: How long the rival keeps trying to take the evicted locks, in seconds.
RIVAL_SECONDS = 5.0
HANG = 30.0


@dataclass
class Outcome:
    """One run's counts."""

    held: int
    evicted: int
    taken_first: int  # evicted locks the rival held before their holder was told
    told: int  # evicted locks whose holder was told (lock.lost)
    told_after: list[float] = field(default_factory=list)  # from the spike's end to each loss
    spike_seconds: float = 0.0

    def line(self) -> str:
        first = min(self.told_after, default=float("nan"))
        last = max(self.told_after, default=float("nan"))
        return (
            f"{self.evicted} of {self.held} lock keys evicted (spike {self.spike_seconds:.2f} s); "
            f"a rival held {self.taken_first} of them before their holder was told; "
            f"{self.told} holders told {first:.2f}-{last:.2f} s after the spike ended"
        )


#: The spike's size: ballast (no TTL) written beyond what ``maxmemory`` leaves free.
HEADROOM = 256 * 1024
BALLAST = 16 * 1024


def _spike(admin: redis.Redis, spike_bytes: int | None) -> None:
    """Write TTL-less ballast past ``maxmemory`` (Redis evicts TTL keys to make room).

    ``spike_bytes`` beyond the free headroom, or with None until Redis answers
    OOM (nothing left that volatile-lru may evict). Then the spike ends: the
    ballast is deleted and the limit lifted, so the rival has room.
    """
    used = int(admin.info("memory")["used_memory"])
    admin.config_set("maxmemory", used + HEADROOM)
    count = 100_000 if spike_bytes is None else (HEADROOM + spike_bytes) // BALLAST
    written = 0
    try:
        for index in range(count):
            admin.set(f"ballast:{index}", b"x" * BALLAST)
            written += 1
        if spike_bytes is None:
            raise AssertionError("Redis never ran out of memory")
    except redis.exceptions.OutOfMemoryError:
        pass  # nothing left that volatile-lru may evict
    finally:
        for start in range(0, written, 1000):
            admin.delete(
                *(f"ballast:{index}" for index in range(start, min(written, start + 1000)))
            )
        admin.config_set("maxmemory", 0)


def run(server: RedisServer, cache_keys: int = 0, spike_bytes: int | None = None) -> Outcome:
    """One spike over :data:`LOCKS` held locks on ``server`` (policy volatile-lru).

    ``cache_keys``: 1 KB cache entries with a TTL written before the locks are
    taken (less recently used than the locks, which the watchdog renews), as
    on a Redis that serves a cache and locks. ``spike_bytes``: see :func:`_spike`.
    """
    admin = server.client()
    admin.config_set("maxmemory-policy", "volatile-lru")
    for index in range(cache_keys):
        admin.set(f"cache:{index}", b"c" * 1024, ex=3600)
    told = threading.Condition()
    lost_at: dict[str, float] = {}
    taken_at: dict[str, float] = {}

    def on_lost(lock: RLock) -> None:
        with told:
            lost_at.setdefault(lock.name, time.monotonic())
            told.notify_all()

    with LockClient(server.url, key_prefix="e", watchdog_timeout=WATCHDOG) as client:
        names = [f"order:{index}" for index in range(LOCKS)]
        held: list[RLock] = []
        holding = threading.Event()
        done = threading.Event()

        def hold() -> None:
            # Stays alive to the end: a hold whose thread has ended is not renewed.
            for name in names:
                lock = client.lock(name)
                lock.on_lost(on_lost)
                assert lock.acquire(blocking=False)
                held.append(lock)
            holding.set()
            done.wait(HANG)
            for lock in held:
                with contextlib.suppress(LockLostError):  # evicted: what this is about
                    lock.release()

        holder = threading.Thread(target=hold)
        holder.start()
        assert holding.wait(HANG)

        spike_at = time.monotonic()
        _spike(admin, spike_bytes)
        freed_at = time.monotonic()
        evicted = [lock.name for lock in held if not admin.exists(lock.keys.hash)]

        def rival() -> None:
            deadline = time.monotonic() + RIVAL_SECONDS
            while time.monotonic() < deadline and len(taken_at) < len(evicted):
                for name in evicted:
                    if name in taken_at:
                        continue
                    try:
                        if client.lock(name).acquire(blocking=False):
                            taken_at[name] = time.monotonic()
                    except LockOutOfMemoryError:
                        pass  # still full: try again

        rival_thread = threading.Thread(target=rival)
        rival_thread.start()
        rival_thread.join(HANG)
        with told:
            told.wait_for(lambda: all(name in lost_at for name in evicted), HANG)
        told_names = [name for name in evicted if name in lost_at]
        outcome = Outcome(
            held=LOCKS,
            evicted=len(evicted),
            taken_first=sum(
                1 for name in told_names if name in taken_at and taken_at[name] < lost_at[name]
            ),
            told=len(told_names),
            told_after=[lost_at[name] - freed_at for name in told_names],
            spike_seconds=freed_at - spike_at,
        )
        for name in taken_at:
            client.lock(name).force_release()
        done.set()
        holder.join(HANG)
    admin.close()
    return outcome


#: The runs ``main`` measures: (cache keys with a TTL, spike bytes past the limit).
SCENARIOS = ((0, None), (2000, None), (2000, 1024 * 1024))


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    with RedisServer() as server:
        version = server.client().info("server")["redis_version"]
    for cache_keys, spike_bytes in SCENARIOS:
        spike = "until OOM" if spike_bytes is None else f"{spike_bytes // 1024} KB past the limit"
        print(
            f"redis-server {version}, maxmemory-policy volatile-lru, watchdog {WATCHDOG} s, "
            f"{cache_keys} cache keys with a TTL, spike {spike}"
        )
        for _ in range(runs):
            with RedisServer() as server:
                print(run(server, cache_keys, spike_bytes).line(), flush=True)


if __name__ == "__main__":
    main()
