"""The run's timeline: who held which lock when, and what happened to each hold.

A :class:`Timeline` is written to while the run goes on, from several threads:
the renewal monitor extends each grant it sees and marks its renewals, the
scenarios mark the SIGKILL, the freed lock, the pause and the refused write.
Times are seconds since the timeline began (``time.monotonic()``); times read
from the database (wall clock, another process) are converted with
:meth:`Timeline.at_wall`. :meth:`Timeline.recorded` gives a frozen copy, which
:mod:`demo.picture` draws.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Literal

#: What a mark on a hold stands for.
MarkKind = Literal[
    "renewal",  # the holder's watchdog set the TTL back up
    "sigkill",  # the holder's process was SIGKILLed
    "freed",  # the lock of a dead holder expired
    "paused",  # the holder stopped running, still believing it holds the lock
    "expired",  # the lease ran out while the holder was paused: the lock is no longer its own
    "refused",  # the holder's late write was refused by the fencing token
    "lost",  # the holder's release() said it had lost the lock
]


@dataclass(frozen=True)
class Mark:
    """Something that happened to one hold, at ``at`` seconds into the run."""

    at: float
    kind: MarkKind
    label: str


@dataclass(frozen=True)
class Grant:
    """One hold of one lock: its fencing token, who held it, from when to when.

    ``end`` is when the lock stopped being this holder's (released, expired or
    freed); None if it still was when the timeline was copied.
    """

    lock: str
    token: int
    holder: str
    start: float
    end: float | None
    marks: tuple[Mark, ...] = ()

    def kinds(self) -> set[MarkKind]:
        """The kinds of mark this hold has."""
        return {mark.kind for mark in self.marks}


@dataclass(frozen=True)
class Recorded:
    """A frozen copy of the timeline: every grant, by lock then start time."""

    started_wall: float  # time.time() when the timeline began
    duration: float  # seconds from its beginning to the copy
    grants: tuple[Grant, ...]

    def marks(self, kind: MarkKind) -> list[tuple[Grant, Mark]]:
        """Every mark of ``kind``, with its hold, in time order."""
        found = [(grant, mark) for grant in self.grants for mark in grant.marks]
        return sorted(
            ((grant, mark) for grant, mark in found if mark.kind == kind),
            key=lambda pair: pair[1].at,
        )


@dataclass
class _Hold:
    """A grant being recorded."""

    lock: str
    token: int
    start: float
    end: float | None
    holder: str = ""
    marks: list[Mark] = field(default_factory=list)


class Timeline:
    """Holds and marks recorded as the run goes on; safe to use from any thread."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.started_wall = time.time()
        self._holds: dict[tuple[str, int], _Hold] = {}
        self._mutex = threading.Lock()

    def now(self) -> float:
        """Seconds since the timeline began."""
        return time.monotonic() - self.started

    def at_monotonic(self, moment: float) -> float:
        """A ``time.monotonic()`` of this process as seconds into the timeline."""
        return moment - self.started

    def at_wall(self, moment: datetime) -> float:
        """A wall-clock time (a database timestamp, any process) as seconds into the timeline."""
        return moment.timestamp() - self.started_wall

    def seen(self, lock: str, token: int, at: float | None = None) -> None:
        """``lock`` is held under ``token`` now (or at ``at``): start or extend that grant."""
        at = self.now() if at is None else at
        with self._mutex:
            hold = self._holds.get((lock, token))
            if hold is None:
                self._holds[(lock, token)] = _Hold(lock, token, at, at)
                return
            hold.start = min(hold.start, at)
            hold.end = at if hold.end is None else max(hold.end, at)

    def held(self, lock: str, token: int, start: float, end: float | None, holder: str) -> None:
        """Record a whole grant at once (known from elsewhere: the database, the scenario)."""
        with self._mutex:
            hold = self._holds.setdefault((lock, token), _Hold(lock, token, start, end))
            hold.start, hold.end, hold.holder = start, end, holder

    def ended(self, lock: str, token: int, at: float) -> None:
        """The grant ``token`` of ``lock`` stopped being its holder's at ``at``."""
        with self._mutex:
            hold = self._holds.setdefault((lock, token), _Hold(lock, token, at, at))
            hold.end = at

    def mark(
        self, lock: str, token: int, kind: MarkKind, label: str, at: float | None = None
    ) -> None:
        """Something happened to the grant ``token`` of ``lock``, now (or at ``at``)."""
        at = self.now() if at is None else at
        with self._mutex:
            hold = self._holds.setdefault((lock, token), _Hold(lock, token, at, None))
            hold.marks.append(Mark(at, kind, label))

    def name_holder(self, lock: str, token: int, holder: str) -> None:
        """Say who held the grant ``token`` of ``lock`` (known once the run is over)."""
        with self._mutex:
            hold = self._holds.get((lock, token))
            if hold is not None:
                hold.holder = holder

    def grants(self) -> list[tuple[str, int]]:
        """The (lock, token) of every grant recorded so far."""
        with self._mutex:
            return list(self._holds)

    def recorded(self) -> Recorded:
        """A frozen copy of everything recorded so far."""
        with self._mutex:
            holds = [replace(hold, marks=list(hold.marks)) for hold in self._holds.values()]
        grants = tuple(
            Grant(
                lock=hold.lock,
                token=hold.token,
                holder=hold.holder or f"token {hold.token}",
                start=hold.start,
                end=hold.end,
                marks=tuple(sorted(hold.marks, key=lambda mark: mark.at)),
            )
            for hold in sorted(holds, key=lambda hold: (hold.lock, hold.start, hold.token))
        )
        return Recorded(self.started_wall, self.now(), grants)
