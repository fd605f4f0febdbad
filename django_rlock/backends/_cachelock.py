"""The lock ``cache.lock()`` returns: django-rlock's RLock, shaped like redis-py's Lock.

Code written for django-redis or redis-py (``cache.lock(key, timeout=10,
blocking_timeout=5)``, ``lock.acquire(blocking=False)``, ``except LockError``)
keeps working when the cache backend becomes :class:`django_rlock.cache.RedisCache`:

* :class:`CacheLock` is an :class:`~django_rlock.core.RLock` (reentrant,
  watchdog-renewed, fenced) whose ``acquire()`` also takes redis-py's keywords
  and, like redis-py's, falls back on the defaults given to ``cache.lock()``;
* its errors are both django-rlock's and redis-py's: a busy ``with`` raises
  :class:`CacheLockTimeout` (a :class:`~django_rlock.core.LockTimeout` and a
  ``redis.exceptions.LockError``), a release of a lock not held
  :class:`CacheLockNotOwnedError` (a :class:`~django_rlock.core.LockNotOwnedError`
  and a ``redis.exceptions.LockNotOwnedError``), and of a lost one
  :class:`CacheLockLostError` (a :class:`~django_rlock.core.LockLostError` too).
  The price of the redis-py side: like redis-py's, these are also ``ValueError``.

A busy ``with`` raises :class:`CacheLockTimeout` with ``retry_after`` set by
``rlock()``'s rule (:mod:`django_rlock._observers.holdtimes`: how long the holder has
held the lock so far, bounded by its lease left), so a view that lets it
reach :class:`~django_rlock.middleware.LockErrorMiddleware` answers 409 with
the same honest ``Retry-After`` as ``rlock()``'s, not the lease left.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from redis import exceptions as redis_errors

from django_rlock._observers.retryafter import lock_retry_after
from django_rlock.core import RLock
from django_rlock.core.exceptions import (
    LockError,
    LockLostError,
    LockNotOwnedError,
    LockTimeout,
)

if TYPE_CHECKING:
    from django_rlock.core import LockClient

logger = logging.getLogger("django_rlock.cache")


class CacheLockTimeout(LockTimeout, redis_errors.LockError):
    """``with cache.lock(...)`` stayed busy for the whole wait (redis-py raises LockError)."""

    def __init__(
        self, message: str, *, name: str | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message, name=name, retry_after=retry_after)
        # redis-py's LockError attributes (its __init__ is not on this MRO path).
        self.message = message
        self.lock_name = name


class CacheLockNotOwnedError(LockNotOwnedError, redis_errors.LockNotOwnedError):
    """The calling thread released a cache lock it does not hold; nothing changed."""

    def __init__(self, message: str, *, name: str | None = None) -> None:
        super().__init__(message, name=name)
        self.message = message
        self.lock_name = name


class CacheLockLostError(LockLostError, CacheLockNotOwnedError):
    """The cache lock expired or was taken over before its release."""


# Named by the module they lived in before, which this version keeps
# (django_rlock._cache_lock re-exports them): a Celery result that stores one
# (pickled by the pickle serializer, by module path in JSON) then loads in a
# process of the previous release too, during a rolling upgrade. Named by
# this module, an upgraded worker's result raised ModuleNotFoundError there.
for _error in (CacheLockTimeout, CacheLockNotOwnedError, CacheLockLostError):
    _error.__module__ = "django_rlock._cache_lock"


class CacheLock(RLock):
    """django-rlock's reentrant lock with redis-py's ``Lock`` manners.

    ``acquire()`` with no arguments uses the defaults given to ``cache.lock()``
    (``blocking``, ``blocking_timeout``, and ``timeout`` as the lease), as
    redis-py's does. ``raise_on_release_error=False`` makes ``with`` log a
    failed release (a lock lost in the block) instead of raising it.
    """

    def __init__(
        self,
        client: LockClient,
        name: str,
        *,
        timeout: float | None = None,
        lease: float | None = None,
        blocking: bool = True,
        raise_on_release_error: bool = True,
    ) -> None:
        super().__init__(client, name, timeout=timeout, lease=lease, blocking=blocking)
        self.raise_on_release_error = raise_on_release_error

    def __repr__(self) -> str:
        return f"<CacheLock {self.name!r}>"

    def acquire(
        self,
        blocking: bool | None = None,
        timeout: float | None = None,
        lease: float | None = None,
        *,
        sleep: float | None = None,
        blocking_timeout: float | None = None,
        token: object = None,
    ) -> bool:
        """Take the lock (or one more hold on it); True when held.

        Each argument left at None falls back on the lock's own default from
        ``cache.lock()``. ``blocking_timeout`` is redis-py's name for
        ``timeout`` (the longest wait); give one or the other. ``sleep`` is
        accepted and ignored: waiters are woken by the release, never by a
        poll. ``token`` is refused: the owner id is the calling thread's,
        made by django-rlock, and is never chosen by the caller.
        """
        del sleep  # redis-py's poll interval: nothing polls here
        if token is not None:
            raise ValueError(
                "acquire(token=...) is not supported: django-rlock identifies the owner "
                "(this thread) itself, and a chosen owner id could release another's lock"
            )
        if timeout is not None and blocking_timeout is not None:
            raise ValueError(
                "give the longest wait once: timeout or blocking_timeout (its redis-py name)"
            )
        wait = timeout if timeout is not None else blocking_timeout
        blocking = self.blocking if blocking is None else blocking
        if not blocking and timeout is not None:
            # As every lock kind (threading.Lock too); redis-py's own name,
            # blocking_timeout, stays ignored with blocking=False, as redis-py does.
            raise ValueError("can't specify a timeout for a non-blocking call")
        if wait is None and blocking:
            wait = self.timeout
        # redis-py ignores a wait given with blocking=False: one attempt either way.
        return super().acquire(
            blocking, wait if blocking else None, self.lease if lease is None else lease
        )

    def release(self) -> None:
        """Give back one hold, raising errors that redis-py's ``except`` clauses catch.

        :class:`CacheLockNotOwnedError` when the calling thread holds nothing
        (nothing changes), :class:`CacheLockLostError` when its hold expired or
        was taken over.
        """
        try:
            super().release()
        except LockLostError as error:
            raise CacheLockLostError(str(error), name=self.name) from None
        except LockNotOwnedError as error:
            raise CacheLockNotOwnedError(str(error), name=self.name) from None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            self.release()
        except LockError:
            if self.raise_on_release_error:
                raise
            logger.warning(
                "lock %r was lost or not held when its block ended (raise_on_release_error=False)",
                self.name,
            )

    def _timeout_error(
        self, remaining: float | None, holder: Mapping[str, Any] | None = None
    ) -> LockTimeout:
        error = super()._timeout_error(remaining, holder)
        # rlock()'s Retry-After rule, not the lease left (30 s for a watchdog
        # hold held a moment): the middleware finds no alias lock to refine it.
        honest = lock_retry_after(self, remaining)
        return CacheLockTimeout(
            str(error), name=self.name, retry_after=remaining if honest is None else honest
        )
