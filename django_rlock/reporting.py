"""What the Django face adds to every lock: signals and the slow-lock log.

Every backend hands out locks of a class built on :class:`ReportingLock`, so a
lock taken through ``locks[alias]`` reports itself however it is used
(``with``, ``acquire()``/``release()``, a decorator, a Celery task):

* :data:`~django_rlock.signals.lock_acquired` when the caller goes from no hold
  to one, :data:`~django_rlock.signals.lock_released` when it gives back its
  last, :data:`~django_rlock.signals.lock_lost` when a hold is lost;
* a WARNING on the ``django_rlock.slow`` logger when a wait took longer than
  ``SLOW_WAIT`` seconds or a hold lasted longer than ``SLOW_HOLD``, naming the
  lock, its alias, the seconds and the code location that took the lock.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import sysconfig
import threading
import weakref
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from django_rlock.core import clock, forking
from django_rlock.core.aio.lock import AsyncRLock
from django_rlock.core.exceptions import LockLostError
from django_rlock.core.identity import task_owner, thread_owner
from django_rlock.core.lock import RLock
from django_rlock.signals import lock_acquired, lock_lost, lock_released

if TYPE_CHECKING:
    from django_rlock.backends.base import AsyncLock, BaseLockBackend

__all__ = [
    "AsyncReportingLock",
    "HoldTracker",
    "ReportingLock",
    "caller_location",
    "send_lost",
    "slow_logger",
]

slow_logger = logging.getLogger("django_rlock.slow")

# Frames from these directories are the machinery between the user's code and
# the lock (this library, its Celery face, the standard library's contextlib,
# threading, asyncio...); the location reported is the first frame outside them.
_SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MACHINERY = (
    os.path.join(_SOURCE_ROOT, "django_rlock") + os.sep,
    os.path.join(_SOURCE_ROOT, "celery_rlock") + os.sep,
    sysconfig.get_paths()["stdlib"] + os.sep,
)


def caller_location() -> str | None:
    """``path:line in function`` of the nearest caller outside the lock machinery."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_MACHINERY):
            return f"{filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back  # type: ignore[assignment]  # None ends the loop
    return None


@dataclass(eq=False)
class _Holding:
    depth: int
    since: float
    location: str | None


class HoldTracker:
    """Which owners hold which lock names through one backend, and since when.

    Holds are counted per ``(name, owner)`` rather than per lock object, as Redis
    counts them: two lock objects of one name in one thread share their holds.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        forking.renew_after_fork(self, "_mutex")
        self._holdings: dict[tuple[str, str], _Holding] = {}

    def entered(self, name: str, location: str | None, owner: str) -> bool:
        """Count one more hold of ``owner``; True for its first."""
        key = (name, owner)
        with self._mutex:
            holding = self._holdings.get(key)
            if holding is not None:
                holding.depth += 1
                return False
            self._holdings[key] = _Holding(depth=1, since=clock.monotonic(), location=location)
            return True

    def left(self, name: str, owner: str) -> _Holding | None:
        """Count one hold of ``owner`` given back; the holding when it was its last."""
        key = (name, owner)
        with self._mutex:
            holding = self._holdings.get(key)
            if holding is None:
                return None
            holding.depth -= 1
            if holding.depth > 0:
                return None
            del self._holdings[key]
            return holding


class _Reporting:
    """The reporting shared by the sync and the async lock of a backend."""

    backend: BaseLockBackend
    location: str | None = None
    name: str

    def _report_acquired(self, *, acquired: bool, waited: float, owner: str) -> None:
        backend = self.backend
        location = self.location
        if location is None and (backend.slow_wait is not None or backend.slow_hold is not None):
            location = caller_location()
        if backend.slow_wait is not None and waited > backend.slow_wait:
            slow_logger.warning(
                "slow lock wait: %r (alias %r) waited %.3fs%s at %s",
                self.name,
                backend.alias,
                waited,
                "" if acquired else " and timed out",
                location or "an unknown location",
                extra={"lock_name": self.name, "alias": backend.alias, "seconds": waited},
            )
        if acquired and backend.tracker.entered(self.name, location, owner):
            lock_acquired.send(
                sender=type(backend), name=self.name, alias=backend.alias, lock=self, waited=waited
            )

    def _report_released(self, *, lost: bool, owner: str) -> None:
        backend = self.backend
        holding = backend.tracker.left(self.name, owner)
        if holding is None:
            return
        held = clock.monotonic() - holding.since
        if backend.slow_hold is not None and held > backend.slow_hold:
            slow_logger.warning(
                "slow lock hold: %r (alias %r) held %.3fs, taken at %s",
                self.name,
                backend.alias,
                held,
                holding.location or "an unknown location",
                extra={"lock_name": self.name, "alias": backend.alias, "seconds": held},
            )
        lock_released.send(
            sender=type(backend),
            name=self.name,
            alias=backend.alias,
            lock=self,
            held=held,
            lost=lost,
        )


class ReportingLock(_Reporting, RLock):
    """An :class:`RLock` that sends the lock signals and writes the slow-lock log.

    Backends mix it in front of their lock implementation; ``backend`` is set
    by the backend that made the lock. ``location`` may be set by the caller
    (``@locked`` sets the decorated function's) to name the code that takes
    the lock in the slow-lock log; otherwise it is read from the call stack.

    ``async with`` on it takes the backend's asyncio twin of the lock (owned
    by the current task) and yields that.
    """

    def acquire(
        self, blocking: bool = True, timeout: float | None = None, lease: float | None = None
    ) -> bool:
        """Take the lock as :meth:`RLock.acquire` does, then report it."""
        started = clock.monotonic()
        acquired = super().acquire(blocking, timeout, lease)
        waited = clock.monotonic() - started
        self._report_acquired(acquired=acquired, waited=waited, owner=thread_owner())
        return acquired

    def release(self) -> None:
        """Give back one hold as :meth:`RLock.release` does, then report it."""
        try:
            super().release()
        except LockLostError:
            self._report_released(lost=True, owner=thread_owner())
            raise
        self._report_released(lost=False, owner=thread_owner())

    async def __aenter__(self) -> AsyncLock:
        twin = self.backend.async_lock(
            self.name, timeout=self.timeout, lease=self.lease, blocking=self.blocking
        )
        entered = await twin.__aenter__()
        self._twins().setdefault(_current_task(), []).append(twin)
        return entered

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        twins = self._twins()
        task = _current_task()
        stack = twins[task]
        twin = stack.pop()
        if not stack:
            del twins[task]
        await twin.__aexit__(exc_type, exc, traceback)

    def _twins(self) -> weakref.WeakKeyDictionary[asyncio.Task[Any], list[AsyncLock]]:
        # Per task, the async locks entered through this object (nested: a stack).
        twins = self.__dict__.get("_async_twins")
        if twins is None:
            twins = self.__dict__["_async_twins"] = weakref.WeakKeyDictionary()
        return twins


class AsyncReportingLock(_Reporting, AsyncRLock):
    """An :class:`AsyncRLock` that sends the lock signals and writes the slow-lock log."""

    async def acquire(
        self, blocking: bool = True, timeout: float | None = None, lease: float | None = None
    ) -> bool:
        """Take the lock as :meth:`AsyncRLock.acquire` does, then report it."""
        started = clock.monotonic()
        acquired = await super().acquire(blocking, timeout, lease)
        waited = clock.monotonic() - started
        self._report_acquired(acquired=acquired, waited=waited, owner=task_owner())
        return acquired

    async def release(self) -> None:
        """Give back one hold as :meth:`AsyncRLock.release` does, then report it."""
        owner = task_owner()
        try:
            await super().release()
        except LockLostError:
            self._report_released(lost=True, owner=owner)
            raise
        self._report_released(lost=False, owner=owner)


def _current_task() -> asyncio.Task[Any]:
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("async with on a lock must run inside an asyncio task")
    return task


def send_lost(lock: object) -> None:
    """Client-wide loss callback: send :data:`lock_lost` for a lock of a backend."""
    if isinstance(lock, _Reporting):
        backend = lock.backend
        lock_lost.send(sender=type(backend), name=lock.name, alias=backend.alias, lock=lock)
