"""A process of callers of one rate limiter, for the accuracy test (tests/sync/test_ratelimiter.py).

``python -m tests.sync.ratelimit_caller URL NAME RATE BURST SECONDS`` connects,
prints ``ready``, reads the start (a ``time.monotonic()`` reading: the clock is
the machine's, shared by every process) from its input, then runs two threads
until start + SECONDS: one calling ``acquire(timeout=<what is left>)`` (it
sleeps until its permit is due), one calling ``try_acquire()`` every 2 ms. A
third thread measures how late the machine runs it (sleeps of 5 ms, and by how
much each overshoots): a grant is recorded when its thread runs again, so a
loaded machine records it that much late. It prints one JSON object: the
``time.monotonic()`` of every grant (``grants``), the longest overshoot
(``late``) and every overshoot over 10 ms (``stalls``), in seconds.
"""

from __future__ import annotations

import json
import sys
import threading
import time

from django_rlock.core import LockClient

#: The watching thread's sleep, in seconds.
TICK = 0.005


def main() -> None:
    url, name, rate, burst, seconds = sys.argv[1:6]
    client = LockClient(url, key_prefix="acc")
    limiter = client.rate_limiter(name, rate, burst=int(burst))
    limiter.wait_time()  # connected, script loaded
    print("ready", flush=True)
    start = float(sys.stdin.readline())
    deadline = start + float(seconds)
    grants: list[float] = []
    mutex = threading.Lock()

    def waiting() -> None:
        while (left := deadline - time.monotonic()) > 0:
            if limiter.acquire(timeout=left):
                now = time.monotonic()
                with mutex:
                    grants.append(now)

    def trying() -> None:
        while time.monotonic() < deadline:
            if limiter.try_acquire():
                now = time.monotonic()
                with mutex:
                    grants.append(now)
            else:
                time.sleep(0.002)

    overshoots: list[float] = []

    def watching() -> None:
        while (before := time.monotonic()) < deadline:
            time.sleep(TICK)
            overshoots.append(max(0.0, time.monotonic() - before - TICK))

    threads = [threading.Thread(target=f) for f in (waiting, trying, watching)]
    while time.monotonic() < start:
        time.sleep(max(0.0, min(0.05, start - time.monotonic())))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    client.close()
    stalls = [late for late in overshoots if late > 0.01]
    measured = {"grants": grants, "late": max(overshoots, default=0.0), "stalls": stalls}
    print(json.dumps(measured), flush=True)


if __name__ == "__main__":
    main()
