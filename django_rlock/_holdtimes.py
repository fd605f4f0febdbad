"""How long locks are really held: the honest ``Retry-After``, from the first request.

A busy view answers 409 with a ``Retry-After``, and a busy Celery task retries
after a countdown. The holder's remaining lease is only an upper bound (a
watchdog lease is 30 s however short the holds are), so both follow one rule,
:meth:`HoldTimes.retry_after`:

1. the median of the holds this process saw end recently for the same lock
   name, or else for the same key template (``order:{order_id}``);
2. with no such history (fewer than :data:`MIN_SAMPLES` holds), how long the
   current holder has held the lock so far (its ``acquired_at``, stored with
   the lock): a lock held 0.2 s is likely free soon, one held ten minutes is not;
3. when that cannot be read either, the lease left;

always bounded by the lease left (the lock is free by then at the latest) and
at least :data:`MIN_RETRY_AFTER` second.

:func:`retry_after` applies the rule for a backend's lock name, reading the
holder (one round trip, only when there is no history); :func:`lock_retry_after`
does the same for a lock object (the middleware, Celery's countdown).

Only this process's holds are seen (each process learns from its own); memory
is bounded: the last :data:`SAMPLES` holds per name for the
:data:`NAMES` most recently seen names, and per template.
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
import time
from collections import OrderedDict, deque
from typing import TYPE_CHECKING

from django_rlock._aliaslocks import AliasAttached
from django_rlock._threadowned import ThreadOwnedLock
from django_rlock.core._aio.locks import AsyncRLock
from django_rlock.core._process import forking
from django_rlock.core._process.holder import SINCE_FIELD
from django_rlock.core._protocol.names import LockKeys
from django_rlock.core._sync.locks import RLock

if TYPE_CHECKING:
    from django_rlock.backends.base import BaseLockBackend

__all__ = [
    "MIN_RETRY_AFTER",
    "NAMES",
    "SAMPLES",
    "HoldTimes",
    "holder_held_for",
    "lock_retry_after",
    "retry_after",
]

logger = logging.getLogger("django_rlock.lock")

#: Holds kept per lock name and per key template.
SAMPLES = 16
#: Lock names whose holds are kept (the least recently seen are forgotten).
NAMES = 1024
#: Fewer holds than this say nothing yet: the current holder's time so far is used instead.
MIN_SAMPLES = 3
#: The shortest back-off asked of a client, in seconds (Retry-After counts whole seconds).
MIN_RETRY_AFTER = 1.0


class HoldTimes:
    """Recent hold durations of one backend's locks, per name and per key template."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        forking.renew_after_fork(self, "_mutex")
        self._by_name: OrderedDict[str, deque[float]] = OrderedDict()
        self._by_template: dict[str, deque[float]] = {}

    def observe(self, name: str, template: str | None, held: float) -> None:
        """Record a hold of ``name`` (built from ``template``, if any) that lasted ``held`` s."""
        with self._mutex:
            samples = self._by_name.pop(name, None) or deque(maxlen=SAMPLES)
            samples.append(held)
            self._by_name[name] = samples
            if len(self._by_name) > NAMES:
                self._by_name.popitem(last=False)
            if template is not None:
                self._by_template.setdefault(template, deque(maxlen=SAMPLES)).append(held)

    def typical(self, name: str, template: str | None) -> float | None:
        """The median recent hold of ``name``, else of ``template``; None with too few."""
        with self._mutex:
            for samples in (self._by_name.get(name), self._by_template.get(template or "")):
                if samples is not None and len(samples) >= MIN_SAMPLES:
                    return statistics.median(samples)
        return None

    def retry_after(
        self,
        name: str,
        template: str | None,
        lease_left: float | None,
        held_for: float | None = None,
    ) -> float:
        """Seconds a caller turned away from ``name`` should wait before trying again.

        The rule of this module, in one place: the typical recent hold, else
        ``held_for`` (how long the current holder has held the lock so far;
        0 when it was found free), else ``lease_left``; bounded by
        ``lease_left`` (the holder's TTL: the lock is free by then at the
        latest) and at least :data:`MIN_RETRY_AFTER`.
        """
        return back_off(self.typical(name, template), held_for, lease_left)


def back_off(typical: float | None, held_for: float | None, lease_left: float | None) -> float:
    """The rule: ``typical`` (a recent hold), else ``held_for``, else ``lease_left``; bounded.

    See :meth:`HoldTimes.retry_after`; also used alone for a lock of no alias,
    which has no hold history (``typical`` None).
    """
    bound = lease_left if lease_left is not None and math.isfinite(lease_left) else None
    estimate = typical
    if estimate is None and held_for is not None and math.isfinite(held_for):
        # Held t so far: as likely to end within about t more as not
        # (a 0.2 s hold does not make a client wait out a 30 s lease).
        estimate = max(0.0, held_for)
    if estimate is None:
        seconds = bound if bound is not None else MIN_RETRY_AFTER
    else:
        seconds = estimate if bound is None else min(estimate, bound)
    return max(MIN_RETRY_AFTER, seconds)


def holder_held_for(backend: BaseLockBackend, name: str) -> float | None:
    """Seconds the current holder of lock ``name`` has held it; 0.0 when nobody holds it.

    One round trip (:meth:`~django_rlock.backends.base.BaseLockBackend.inspect`).
    None when it cannot be told: the server did not answer, or the grant
    stored no ``acquired_at``. Never raises: it only refines a hint.
    """
    try:
        info = backend.inspect(name)
    except Exception as error:  # noqa: BLE001 -- a hint must never fail the 409 it refines
        logger.debug("could not read the holder of lock %r: %s", name, error)
        return None
    if info is None:
        return 0.0  # released since the caller was turned away: retry soon
    return info.held_for()


def retry_after(
    backend: BaseLockBackend,
    name: str,
    template: str | None,
    lease_left: float | None,
    *,
    read_holder: bool = True,
) -> float:
    """:meth:`HoldTimes.retry_after` for lock ``name`` of ``backend``, reading its holder if needed.

    ``template`` is the key template the name was built from (None for a name
    given as it is), ``lease_left`` the holder's TTL in seconds (what
    :class:`~django_rlock.exceptions.LockTimeout` carries as ``retry_after``).
    The holder is read (one round trip) only when this process has no recent
    holds of the name or template. Pass ``read_holder=False`` for a kind
    whose holder ``inspect`` does not read (a semaphore, a fair or read-write
    lock): it keeps the lease left as the fallback. Blocking I/O: from async
    code, call it in a thread (``sync_to_async``).
    """
    times = backend.hold_times
    held_for = None
    if read_holder and times.typical(name, template) is None:
        held_for = holder_held_for(backend, name)
    return times.retry_after(name, template, lease_left, held_for)


def lock_retry_after(lock: object, lease_left: float | None) -> float | None:
    """:func:`retry_after` for a lock a backend handed out (sync, asyncio or thread-run).

    The holder is read only for a plain lock, whose hash is the one
    ``inspect(name)`` reads (a semaphore's or fair lock's holders live
    elsewhere). A plain engine lock of no alias (Celery without Django) has no
    hold history: its holder's age alone, by :func:`back_off`. None for the
    other kinds of no alias.
    """
    inner = lock.lock if isinstance(lock, ThreadOwnedLock) else lock
    if not isinstance(inner, RLock | AsyncRLock):
        return None
    plain = inner.keys == LockKeys.build(inner.client.key_prefix, inner.name)
    if isinstance(inner, AliasAttached):
        return retry_after(
            inner.backend, inner.name, inner.key_template, lease_left, read_holder=plain
        )
    if isinstance(inner, RLock) and plain:
        # A lock of no alias (Celery without Django): no hold history, but its holder's age.
        return back_off(None, _holder_age(inner), lease_left)
    return None


def _holder_age(lock: RLock) -> float | None:
    """Seconds the holder of a bare lock has held it (0.0: free by now); None when unknown."""
    try:
        since = lock.client.redis.hget(lock.keys.hash, SINCE_FIELD)
    except Exception as error:  # noqa: BLE001 -- a hint must never fail what it refines
        logger.debug("could not read the holder of lock %r: %s", lock.name, error)
        return None
    if since is None:
        return 0.0  # released since the caller was turned away: retry soon
    # The grant's time is the server's clock; compared with this machine's, as
    # LockInfo.held_for() does.
    return max(0.0, time.time() - int(since) / 1000)
