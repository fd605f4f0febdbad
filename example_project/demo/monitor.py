"""The report locks seen from outside: their TTL read every 50 ms, renewals counted.

It reads them with ``locks["default"].inspect()``, as ``manage.py rlock inspect``
does: each time a lock's TTL goes back up, its holder's watchdog renewed it. Every
grant it sees, and every renewal, goes on the run's :class:`~demo.timeline.Timeline`.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType

from django.db import connection
from django_rlock import locks

from demo.outcomes import Renewals
from demo.timeline import Timeline

#: How often the monitor reads the locks (seconds).
INTERVAL = 0.05


def report_lock(customer: int) -> str:
    """The lock of a customer's report (``build_report``'s ``lock="report:{customer_id}"``)."""
    return f"report:{customer}"


@dataclass
class LockWatch:
    """What the monitor saw of one grant of a report lock."""

    name: str
    token: int
    first_seen: float
    last_seen: float
    last_ttl: float
    lowest_ttl: float
    renewals: int = 0


class RenewalMonitor:
    """A thread watching the given locks while the ``with`` block runs."""

    def __init__(self, names: Iterable[str], timeline: Timeline) -> None:
        self.names = list(names)
        self.timeline = timeline
        self.watches: dict[tuple[str, int], LockWatch] = {}
        self.mutex = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, name="lock-monitor", daemon=True)

    def __enter__(self) -> RenewalMonitor:
        self.thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stopping.set()
        self.thread.join(5)

    def run(self) -> None:
        backend = locks["default"]
        try:
            while not self.stopping.is_set():
                for name in self.names:
                    info = backend.inspect(name)
                    if info is None or info.token is None or info.ttl is None:
                        continue
                    self.observe(name, info.token, info.ttl)
                time.sleep(INTERVAL)
        finally:
            connection.close()

    def observe(self, name: str, token: int, ttl: float) -> None:
        now = time.monotonic()
        self.timeline.seen(name, token, self.timeline.at_monotonic(now))
        with self.mutex:
            watch = self.watches.get((name, token))
            if watch is None:
                self.watches[(name, token)] = LockWatch(name, token, now, now, ttl, ttl)
                return
            # A renewal sets the TTL back to the full timeout: it goes up.
            if ttl > watch.last_ttl + 0.05:
                watch.renewals += 1
                self.timeline.mark(
                    name, token, "renewal", f"TTL {ttl:.2f}s", self.timeline.at_monotonic(now)
                )
            watch.last_ttl = ttl
            watch.last_seen = now
            watch.lowest_ttl = min(watch.lowest_ttl, ttl)

    def watch(self, name: str, token: int) -> LockWatch | None:
        """A copy of what was seen of the grant ``token`` of ``name`` so far."""
        with self.mutex:
            found = self.watches.get((name, token))
            return None if found is None else dataclasses.replace(found)

    def renewals(self) -> int:
        """Renewals seen so far, of every grant."""
        with self.mutex:
            return sum(watch.renewals for watch in self.watches.values())

    def summary(self, *, killed_token: int) -> Renewals:
        """The renewals seen; hold times and TTLs leave out the grant ``killed_token``."""
        with self.mutex:
            watches = list(self.watches.values())
        renewals = sum(watch.renewals for watch in watches)
        finished = [watch for watch in watches if watch.token != killed_token]
        if not finished:
            return Renewals(renewals)
        return Renewals(
            renewals,
            longest_hold=max(watch.last_seen - watch.first_seen for watch in finished),
            lowest_ttl=min(watch.lowest_ttl for watch in finished),
        )
