"""Watching a lock under a fault: when it was lost, and how long each renewal took."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, cast

from django_rlock.core import LockClient, RLock
from django_rlock.core._process.identity import thread_owner
from django_rlock.core._protocol.holds import Hold

__all__ = ["LockWatch", "SchedulingLag", "current_hold"]


def current_hold(lock: RLock, owner: str | None = None) -> Hold:
    """The calling thread's (or ``owner``'s) newest hold on ``lock``, as its client records it."""
    hold = lock.client.holds.newest(lock.keys.hash, owner or thread_owner())
    assert hold is not None, "the owner holds the lock"
    return hold


@dataclass
class LockWatch:
    """Records when ``lock`` is declared lost, and every renewal call of its client.

    ``renewals`` holds ``(started, ended, ok)`` in monotonic seconds: the
    watchdog calls the client's ``renew_batch``, wrapped here on the instance.
    """

    lock: RLock
    lost: threading.Event = field(default_factory=threading.Event)
    lost_at: float | None = None
    renewals: list[tuple[float, float, bool]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.lock.on_lost(self._on_lost)
        client = cast(LockClient, self.lock.client)
        renew = client.renew_batch

        def timed(holds: Sequence[Hold]) -> Any:
            started = time.monotonic()
            try:
                result = renew(holds)
            except Exception:
                self.renewals.append((started, time.monotonic(), False))
                raise
            self.renewals.append((started, time.monotonic(), True))
            return result

        client.renew_batch = timed  # type: ignore[method-assign]

    def _on_lost(self, _lock: object) -> None:
        self.lost_at = time.monotonic()
        self.lost.set()

    def successful_renewals(self) -> int:
        """Renewal calls that returned."""
        return sum(ok for _, _, ok in self.renewals)

    def longest_renewal(self) -> float:
        """The longest renewal call, in seconds (0 when there was none)."""
        return max((ended - started for started, ended, _ in self.renewals), default=0.0)

    def wait_for_renewal(self, timeout: float = 5.0) -> None:
        """Block until one more renewal call has succeeded."""
        before = self.successful_renewals()
        deadline = time.monotonic() + timeout
        while self.successful_renewals() <= before:
            if time.monotonic() > deadline:
                raise AssertionError("no renewal succeeded in time")
            time.sleep(0.01)


class SchedulingLag:
    """The worst lateness of this process's threads while it is entered, measured.

    A thread sleeps in :data:`STEP` steps and records how much later than asked
    each sleep ended: what a loaded machine (or the GIL) adds to any thread's
    timing here. A bound on a duration measured from a thread (a call's end, a
    watchdog's verdict) adds :attr:`worst` instead of guessing a margin: the
    assertion stays as tight as the machine allows, and a loaded machine does
    not fail it.
    """

    #: The probe's sleep, in seconds.
    STEP = 0.005

    def __init__(self) -> None:
        #: The worst lateness seen so far, in seconds.
        self.worst = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._probe, name="scheduling-lag", daemon=True)

    def _probe(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            time.sleep(self.STEP)
            self.worst = max(self.worst, time.monotonic() - started - self.STEP)

    def __enter__(self) -> SchedulingLag:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(5.0)
