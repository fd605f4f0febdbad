"""The types a backend's locks and their observers share, with no backend behind them.

:class:`AsyncLock` and :class:`AsyncReadWriteLock` are what the asyncio
entry points of every backend return (an engine lock or a thread-owned
wrapper); :class:`LockInfo` is what ``inspect`` answers.
:class:`AliasBackend` is what a lock a backend hands out needs of that
backend, and :class:`AliasAttached` the one base of everything a backend
hands out that reports its holds (locks, semaphores, fair locks, both sides
of read-write locks, sync and asyncio): the observers (reporting, metrics,
Retry-After) tell an alias's lock from a bare engine one by it.

Kept apart from :mod:`django_rlock.backends.base` and from the alias locks
so that the alias locks, their observers and the admin can name these
without importing the backends that build them, or each other.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self, Unpack

from django_rlock.core._faces import LockOptions, holder_line

if TYPE_CHECKING:
    from django_rlock._observers.holdtimes import HoldTimes


class AsyncLock(Protocol):
    """What :meth:`BaseLockBackend.async_lock` returns: a lock for ``async with``."""

    @property
    def name(self) -> str:
        """The lock's name."""
        ...

    async def __aenter__(self) -> Self:
        """Take the lock, waiting as the lock's defaults say; LockTimeout when busy."""
        ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Give the hold back."""
        ...


class AsyncReadWriteLock(Protocol):
    """What :meth:`BaseLockBackend.async_read_write_lock` returns: two sides for ``async with``."""

    @property
    def read(self) -> AsyncLock:
        """The shared side: many tasks at once while nobody else writes."""
        ...

    @property
    def write(self) -> AsyncLock:
        """The exclusive side: one task, and no reader but that task."""
        ...


@dataclass(frozen=True)
class LockInfo:
    """What an operator sees of one held lock (``manage.py rlock inspect``).

    ``holders`` maps a display form of each owner (see :func:`display_owner`) to
    its hold count; ``ttl`` is in seconds (``inf`` for no expiry); ``token`` is
    the last fencing token granted for the name; ``waiters`` how many callers
    are registered as waiting for it; ``holder`` who holds it, as the grant
    described it (:mod:`django_rlock.core._process.holder`: host, pid, thread,
    task_id, task_name, acquired_at), None for a grant that did not.
    """

    name: str
    holders: dict[str, int] = field(default_factory=dict)
    ttl: float | None = None
    token: int | None = None
    waiters: int = 0
    holder: dict[str, Any] | None = None
    #: The lock server's clock when this was read (None: unknown), so that
    #: :meth:`held_for` compares the grant's time with the same clock.
    read_at: datetime | None = None
    #: The grant's fixed lease in seconds; None for a hold its holder's watchdog
    #: renews until it is released (or when ``holder`` is None: not described).
    lease: float | None = None

    def holder_text(self) -> str:
        """Who holds it, in one line: host, pid, thread or task, and the Celery task if any.

        The same words as every message that names a holder
        (:func:`~django_rlock.core._process.holder.holder_line`); a grant that
        described no holder shows its owners' digests.
        """
        if self.holder is None:
            return ", ".join(self.holders)
        return holder_line(self.holder)

    def renewal_text(self) -> str:
        """What the TTL means: a fixed lease's end, or a watchdog's margin ("" when unknown)."""
        if self.holder is None:
            return ""
        if self.lease is not None:
            return f"a fixed {self.lease:g}s lease: it ends then"
        return "renewed by its holder's watchdog until released"

    def held_for(self) -> float | None:
        """Seconds since the grant, by the lock server's clock (this machine's if unknown).

        None when the grant recorded no time.
        """
        since = (self.holder or {}).get("acquired_at")
        if not since:
            return None
        now = self.read_at or datetime.now(UTC)
        return max(0.0, (now - datetime.fromisoformat(since)).total_seconds())


def display_owner(owner: str) -> str:
    """An owner id fit to show: the process part digested, the thread id kept.

    The raw owner id is a credential (whoever has it can release the lock), so
    it is never shown; two holds of one process still show the same digest.
    """
    process, _, thread = owner.rpartition(":")
    digest = hashlib.sha256(process.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{digest}:{thread}"


class AliasBackend(Protocol):
    """What a lock a backend hands out needs of that backend (every backend has it).

    The alias's settings that shape a hold, and the asyncio twins ``async with``
    takes; the locks never import the backends that build them.
    """

    alias: str
    #: ``"auto"`` or ``"ignore"``: the alias's ``TRANSACTION``.
    transaction: str
    #: The alias's ``MAX_HOLD`` (None: unbounded).
    max_hold: float | None
    #: What becomes of a hold that outlived its owner: ``"release"`` or ``"warn"``.
    leaked: str
    #: ``RLOCK_LOCK_ORDER_CHECK``: the lock order check watches the alias's holds.
    lock_order_check: bool
    slow_wait: float | None
    slow_hold: float | None

    @property
    def hold_times(self) -> HoldTimes:
        """Recent hold durations of the alias's locks (the honest ``Retry-After``)."""
        ...

    def inspect(self, name: str) -> LockInfo | None:
        """Holders, TTL and fencing token of lock ``name``; None when nobody holds it."""
        ...

    def async_lock(self, name: str, **options: Unpack[LockOptions]) -> AsyncLock:
        """The lock ``name`` for asyncio code, owned by the current task."""
        ...

    def async_fair_lock(self, name: str, **options: Unpack[LockOptions]) -> AsyncLock:
        """The fair lock ``name`` for asyncio code."""
        ...

    def async_read_write_lock(
        self, name: str, **options: Unpack[LockOptions]
    ) -> AsyncReadWriteLock:
        """The read-write lock ``name`` for asyncio code: ``.read`` and ``.write``."""
        ...

    def async_semaphore(self, name: str, permits: int, **options: Unpack[LockOptions]) -> AsyncLock:
        """The semaphore ``name`` of ``permits`` for asyncio code."""
        ...


class AliasAttached:
    """What every lock a backend hands out carries: ``backend``, ``location``, ``key_template``.

    The one base of whatever a backend hands out that reports its holds
    (signals, slow log, hold times, metrics): ``isinstance(lock, AliasAttached)``
    tells an alias's lock from a bare engine one.

    Put before the engine's class (``class AsyncAliasLock(AliasAttached, AsyncRLock)``):
    it is built with the engine class's own arguments and the alias's
    ``backend`` (``AsyncAliasLock(client, name, backend=backend, timeout=5)``),
    so no kind repeats a constructor of its own.
    """

    backend: AliasBackend
    location: str | None
    key_template: str | None
    transaction: str
    max_hold: float | None

    if TYPE_CHECKING:
        # The engine's class after this one in the MRO gives it (declared for
        # the type checker only: defined here, it would shadow the engine's).
        @property
        def name(self) -> str:
            """The lock's name."""
            ...

    def __init__(self, *args: Any, backend: AliasBackend, **options: Unpack[LockOptions]) -> None:
        # The engine's class, next in the MRO, takes its own arguments (a
        # lock's client and name; a semaphore's permits; a side's keys and scripts).
        super().__init__(*args, **options)  # type: ignore[misc]  # not object's: the engine's
        self.backend = backend
        self.location = None
        self.key_template = None
        self.transaction = backend.transaction
        if self.max_hold is None:
            self.max_hold = backend.max_hold
