"""The honest ``Retry-After`` of a busy lock, for a lock name or a lock object.

:class:`~django_rlock._observers.holdtimes.HoldTimes`' rule applied to a backend's lock
name (:func:`retry_after`) or to a lock object (:func:`lock_retry_after`, for
the middleware, Celery's countdown and ``cache.lock()``'s busy error).

The holder is read (one round trip) only when this process has no recent
holds of the name or its template.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from django_rlock._observers.holdtimes import HoldTimes, back_off
from django_rlock.backends._threadowned import ThreadOwnedLock
from django_rlock.backends._types import AliasAttached, LockInfo
from django_rlock.core import RLock
from django_rlock.core._faces import SINCE_FIELD, LockKeys
from django_rlock.core.aio import AsyncRLock

logger = logging.getLogger("django_rlock.lock")


class TimedBackend(Protocol):
    """What the rule needs of a backend: its recent hold times and its holders."""

    @property
    def hold_times(self) -> HoldTimes:
        """Recent hold durations of the backend's locks."""
        ...

    def inspect(self, name: str) -> LockInfo | None:
        """Holders, TTL and fencing token of lock ``name``; None when nobody holds it."""
        ...


def holder_held_for(backend: TimedBackend, name: str) -> float | None:
    """Seconds the current holder of lock ``name`` has held it; 0.0 when nobody holds it.

    One round trip (:meth:`~django_rlock.backends.base.TimedBackend.inspect`).
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
    backend: TimedBackend,
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
    elsewhere). A plain engine lock of no alias (Celery without Django,
    ``cache.lock()``) has no hold history: its holder's age alone, by
    :func:`back_off`. None for the other kinds of no alias.
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
        # A lock of no alias (Celery without Django, cache.lock()): no hold history,
        # but its holder's age.
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
