"""The watchdog: one daemon thread per process keeps every watchdog hold alive.

A hold taken with ``lease=None`` has its key set to expire after the client's
``watchdog_timeout``; the watchdog renews it every ``watchdog_timeout / 3``
until it is released. All holds of one client are renewed together on one
schedule, up to :data:`BATCH_SIZE` keys per EVAL, so 2,000 held locks cost 20
round trips per interval, not 2,000 timers.

When a renewal finds a key gone or owned by someone else, the hold is lost and
the client is told at once. When Redis cannot be reached, the renewal is tried
again on the next tick; the hold counts as lost once its local deadline (last
successful renewal + timeout) has passed, because from then on another owner
may hold the lock. Renewal connections have no hidden retries and a socket
timeout of a fraction of the interval, so no renewal blocks past a deadline.

The thread never dies on an error: it logs it on ``django_rlock.watchdog`` and
carries on. A forked child starts with no watchdog; its first hold starts one.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from django_rlock.core import clock
from django_rlock.core.hold import Hold

__all__ = ["BATCH_SIZE", "Renewer", "Watchdog", "get_watchdog"]

logger = logging.getLogger("django_rlock.watchdog")

#: Locks renewed by one EVAL. Large enough to amortise round trips, small
#: enough that one script never stalls the server for long.
BATCH_SIZE = 100


class Renewer(Protocol):
    """What the watchdog needs from a lock client."""

    watchdog_timeout: float

    def renew_batch(self, holds: Sequence[Hold]) -> list[bool]:
        """Extend each hold's key; True for renewed, False for no longer held."""
        ...

    def declare_lost(self, hold: Hold, reason: str) -> None:
        """Record that ``hold`` is lost and tell its listeners."""
        ...


@dataclass(eq=False)
class _Group:
    """The holds of one client, renewed together on one schedule."""

    renewer: Renewer
    next_tick: float
    holds: set[Hold] = field(default_factory=set)
    failing: bool = False

    @property
    def interval(self) -> float:
        return self.renewer.watchdog_timeout / 3


class Watchdog:
    """Renews the watchdog holds of every client in this process from one thread."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._groups: dict[int, _Group] = {}
        self._thread: threading.Thread | None = None
        #: Renewal EVALs sent since start; read by tests and benchmarks.
        self.renewal_calls = 0

    @property
    def thread(self) -> threading.Thread | None:
        """The renewal thread, once a hold has started it."""
        return self._thread

    def watch(self, renewer: Renewer, hold: Hold) -> None:
        """Renew ``hold`` until :meth:`unwatch`."""
        with self._cond:
            group = self._groups.get(id(renewer))
            if group is None:
                group = _Group(renewer, next_tick=clock.monotonic() + renewer.watchdog_timeout / 3)
                self._groups[id(renewer)] = group
            group.holds.add(hold)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="rlock-watchdog", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def unwatch(self, renewer: Renewer, hold: Hold) -> None:
        """Stop renewing ``hold`` (released or lost)."""
        with self._cond:
            group = self._groups.get(id(renewer))
            if group is None:
                return
            group.holds.discard(hold)
            if not group.holds:
                del self._groups[id(renewer)]

    def forget(self, renewer: Renewer) -> None:
        """Stop renewing every hold of ``renewer`` (its client is closing)."""
        with self._cond:
            self._groups.pop(id(renewer), None)

    def _run(self) -> None:
        while True:
            for group, holds in self._wait_for_due_groups():
                try:
                    self._renew(group, holds)
                except Exception:
                    # A bug here must not end renewals for every other lock.
                    logger.exception("watchdog: unexpected error while renewing locks")

    def _wait_for_due_groups(self) -> list[tuple[_Group, list[Hold]]]:
        with self._cond:
            while True:
                now = clock.monotonic()
                due: list[tuple[_Group, list[Hold]]] = []
                next_wake: float | None = None
                for group in self._groups.values():
                    if group.next_tick <= now:
                        due.append((group, list(group.holds)))
                        group.next_tick = now + group.interval
                    if next_wake is None or group.next_tick < next_wake:
                        next_wake = group.next_tick
                if due:
                    return due
                self._cond.wait(None if next_wake is None else next_wake - now)

    def _renew(self, group: _Group, holds: list[Hold]) -> None:
        renewer = group.renewer
        for start in range(0, len(holds), BATCH_SIZE):
            batch = holds[start : start + BATCH_SIZE]
            sent_at = clock.monotonic()
            self.renewal_calls += 1
            try:
                renewed = renewer.renew_batch(batch)
            except Exception as error:
                self._renewal_failed(group, batch, error)
                continue
            if group.failing:
                group.failing = False
                logger.info("watchdog: renewals succeed again")
            for hold, alive in zip(batch, renewed, strict=True):
                if alive:
                    hold.deadline = max(hold.deadline, sent_at + renewer.watchdog_timeout)
                else:
                    renewer.declare_lost(hold, "its key expired or another owner took it")

    def _renewal_failed(self, group: _Group, batch: list[Hold], error: Exception) -> None:
        if not group.failing:
            group.failing = True
            logger.warning("watchdog: renewal failed, retrying next tick: %s", error)
        now = clock.monotonic()
        alive = []
        for hold in batch:
            if now >= hold.deadline:
                group.renewer.declare_lost(
                    hold, f"renewals failed until its deadline passed ({error})"
                )
            else:
                alive.append(hold)
        if alive:
            # Wake again no later than the first deadline, to report it on time.
            earliest = min(hold.deadline for hold in alive)
            with self._cond:
                group.next_tick = min(group.next_tick, earliest)


_instance: Watchdog | None = None
_instance_lock = threading.Lock()


def get_watchdog() -> Watchdog:
    """The process's watchdog (a new one in a forked child)."""
    global _instance  # noqa: PLW0603 -- one watchdog per process is the design
    with _instance_lock:
        if _instance is None:
            _instance = Watchdog()
        return _instance


def _reset_after_fork() -> None:
    # The parent's thread does not exist in the child, and the child owns
    # none of the parent's holds: start from nothing.
    global _instance, _instance_lock  # noqa: PLW0603
    _instance = None
    _instance_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)
