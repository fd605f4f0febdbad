"""``LockErrorMiddleware``: a view's lock errors answer 409, 429, 503 or 400, never 500.

::

    MIDDLEWARE = [
        ...,
        "django_rlock.middleware.LockErrorMiddleware",
    ]

    def pay(request, order_id):
        with rlock(f"order:{order_id}", timeout=2):   # busy for 2 s: 409, not 500
            ...

For any view, sync or async, that lets one of these escape:

* :class:`~django_rlock.exceptions.LockTimeout` (``with rlock(...)`` could not
  acquire within its ``timeout``): ``409 Conflict`` with a ``Retry-After`` of
  how long the lock is really held (:mod:`django_rlock._observers.holdtimes`: the recent
  holds of the name, else how long its holder has held it so far, bounded by
  its lease left), as ``@locked`` answers. The alias's ``RLOCK_BUSY_RESPONSE``
  applies: another status, a callable ``(request, error) -> HttpResponse``, or
  ``"raise"`` to leave the error to Django (a 500);
* :class:`~django_rlock.exceptions.DeadlockError` (the view's wait in ``with
  rlock(...)`` was the victim of a deadlock: see docs/deadlocks.md): answered
  as a busy lock, ``409 Conflict`` with ``Retry-After`` (or the alias's
  ``RLOCK_BUSY_RESPONSE``); the cycle is logged (WARNING on
  ``django_rlock.lock``, naming every lock and holder). Under
  ``ATOMIC_REQUESTS`` the error has gone through the request's transaction,
  which rolled back: nothing the view did is committed, and the locks kept
  for the transaction are released, so the other members of the cycle go on;
* :class:`~django_rlock.exceptions.RateLimitExceeded` (a ``@rate_limited``
  function the view called is over its limit; a ``LockTimeout``): ``429 Too
  Many Requests`` with ``Retry-After``, as a ``@rate_limited`` view answers;
* :class:`~django_rlock.exceptions.LockUnavailableError` (the lock server
  cannot be reached): ``503 Service Unavailable`` with ``Retry-After``, the
  error logged (``"raise"`` leaves it to Django too);
* :class:`~django_rlock.exceptions.LockLostError` (the lock was lost before
  its ``with`` block ended: force-released by an operator, or expired while
  its server was unreachable past the watchdog timeout): ``503 Service
  Unavailable`` with ``Retry-After`` and ``X-Lock-Release: lost``, the loss
  logged as an ERROR (``"raise"`` leaves it to Django). The view was cut
  short at the block's end: what the block did was done, unless a
  transaction around it rolled it back (``ATOMIC_REQUESTS``: it has, since
  the error went through it), and the rest of the view did not run, so the
  answer claims neither;
* :class:`~django_rlock.exceptions.InvalidLockNameError` (a name that breaks a
  naming rule, usually built from the URL: a slug with ``%0A`` in it):
  ``400 Bad Request``, see :func:`invalid_name_response`.

No response body or header names the lock or the server. Other exceptions
pass through untouched, :class:`~django_rlock.exceptions.LockNotOwnedError`
too (a release of a lock the view does not hold: a mistake in the code).
``@locked`` views need none of this: they answer their own lock's errors
(see :mod:`django_rlock._web.decorators`). Like Django's own middleware it works
in sync and async stacks (``process_exception`` runs where Django runs it,
on a thread for async views).
"""

from __future__ import annotations

import logging
from typing import cast

from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.utils.deprecation import MiddlewareMixin

from django_rlock import _conf as conf
from django_rlock._observers.retryafter import lock_retry_after
from django_rlock._web.ratelimited import limited_answer
from django_rlock._web.responses import (
    busy_status_response,
    invalid_name_response,
    lost_response,
    unavailable_response,
)
from django_rlock.backends._threadowned import ThreadOwnedLock
from django_rlock.backends._types import AliasAttached
from django_rlock.core.defaults import DEFAULT_LOCK_ALIAS
from django_rlock.core.exceptions import (
    DeadlockError,
    InvalidLockNameError,
    LockLostError,
    LockTimeout,
    LockUnavailableError,
    RateLimitExceeded,
)

__all__ = ["LockErrorMiddleware", "invalid_name_response"]

logger = logging.getLogger("django_rlock.lock")


class LockErrorMiddleware(MiddlewareMixin):
    """A busy lock or a deadlock: 409; a rate limit: 429; an outage or a loss: 503; a bad name: 400.

    See the module. Sync and async capable (``MiddlewareMixin``).
    """

    def process_exception(
        self, request: HttpRequest, exception: Exception
    ) -> HttpResponseBase | None:
        """The answer to ``exception`` if it is a lock error this middleware handles, else None."""
        if isinstance(exception, InvalidLockNameError):
            return invalid_name_response(exception)
        if isinstance(exception, RateLimitExceeded):
            # A rate-limited helper the view called: the same 429 as a
            # @rate_limited view's own, not a busy lock's 409.
            # JSON when the request asks for it, or RLOCK_RATE_LIMITED_VIEW's answer.
            return limited_answer(request, exception)
        if isinstance(exception, LockTimeout | LockUnavailableError | DeadlockError):
            return _lock_error_response(request, exception)
        if isinstance(exception, LockLostError):
            return _lost_lock_response(exception)
        return None


def _lock_error_response(
    request: HttpRequest, error: LockTimeout | LockUnavailableError | DeadlockError
) -> HttpResponse | None:
    """409 (or the alias's BUSY_RESPONSE) for a timeout or a deadlock, 503 for an outage."""
    lock = _raising_lock(error)
    alias = lock.backend.alias if lock is not None else DEFAULT_LOCK_ALIAS
    answer = conf.busy_response(alias)
    if answer == "raise":
        return None  # the alias asks for the error itself: Django handles it (a 500)
    if isinstance(error, LockUnavailableError):
        return unavailable_response(error)
    if error.name is not None and lock is not None:
        honest = lock_retry_after(lock, error.retry_after)
        if honest is not None:
            error.retry_after = honest
    if callable(answer):
        return answer(request, error)
    return busy_status_response(error, cast(int, answer))


def _lost_lock_response(error: LockLostError) -> HttpResponse | None:
    """503 with ``X-Lock-Release: lost`` for a lock lost in the view; None for ``"raise"``."""
    lock = _raising_lock(error)
    alias = lock.backend.alias if lock is not None else DEFAULT_LOCK_ALIAS
    if conf.busy_response(alias) == "raise":
        return None  # the alias asks for the error itself: Django handles it (a 500)
    logger.error("a view was cut short by a lost lock, and answers 503: %s", error)
    return lost_response()


def _raising_lock(error: BaseException) -> AliasAttached | None:
    """The lock of an ``RLOCKS`` alias that raised ``error``, found on its traceback.

    The engine raises LockTimeout and LockUnavailableError knowing nothing of
    aliases, and ``rlock()`` hands the view the engine's lock itself: the
    only record of which alias's lock gave up is the lock, ``self`` in the
    frames of its own methods that the error went through. The innermost
    one is taken (``async with`` on a sync alias lock enters its asyncio twin,
    which is the lock that gave up). None when no such frame is found (a
    bare engine lock; ``cache.lock()``, whose error carries the honest
    Retry-After already).
    """
    found: AliasAttached | None = None
    trace = error.__traceback__
    while trace is not None:
        candidate = trace.tb_frame.f_locals.get("self")
        if isinstance(candidate, ThreadOwnedLock):
            candidate = candidate.lock
        if isinstance(candidate, AliasAttached):
            found = candidate
        trace = trace.tb_next
    return found
