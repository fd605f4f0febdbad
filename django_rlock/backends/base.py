"""The interface every lock backend implements, and what they share.

A backend is built once per alias per process by :data:`django_rlock.locks`
and shared by every thread, so everything it owns (connection pools, the lock
client) must be thread-safe and built lazily: constructing a backend reads
and checks settings but never connects.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from typing import Any, Unpack

from django_rlock import _conf as conf
from django_rlock._observers.holdtimes import HoldTimes
from django_rlock._observers.reporting import Reporter
from django_rlock.backends._family import (
    AliasFairLock,
    AliasReadWriteLock,
    ThreadOwnedReadWriteLock,
)
from django_rlock.backends._locks import AliasLock
from django_rlock.backends._ratelimiters import AliasRateLimiter, AsyncLimiter, ThreadRateLimiter
from django_rlock.backends._semaphores import AliasSemaphore
from django_rlock.backends._threadowned import ThreadOwnedLock
from django_rlock.backends._types import AsyncLock, AsyncReadWriteLock, LockInfo, display_owner
from django_rlock.core._faces import LimiterState, LockOptions, forking
from django_rlock.exceptions import InvalidLockBackendError, LockSettingError

__all__ = [
    "AsyncLimiter",
    "AsyncLock",
    "AsyncReadWriteLock",
    "BaseLockBackend",
    "InvalidLockBackendError",
    "LimiterState",
    "LockInfo",
    "display_owner",
]


class BaseLockBackend(ABC):
    """One ``RLOCKS`` alias: makes its locks and answers the operator's questions.

    Subclasses implement :meth:`lock`, :meth:`names` and :meth:`inspect`, and
    may override :meth:`close` and :meth:`maxmemory_policy`.
    """

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        conf.check_alias_keys(alias, params)
        self.alias = alias
        self.params = params
        self.key_prefix = conf.key_prefix(alias)
        self.watchdog_timeout = conf.watchdog_timeout(alias)
        #: Seconds a waiter waits before it looks for a deadlock (None: never).
        self.deadlock_timeout = conf.deadlock_timeout(alias)
        #: Whether the lock order check watches the holds of this alias's clients.
        self.lock_order_check = conf.lock_order_check()
        self.slow_wait = conf.seconds_or_none("SLOW_WAIT", alias)
        self.slow_hold = conf.seconds_or_none("SLOW_HOLD", alias)
        #: Whether a ``with`` block's end waits for its transaction ("auto") or not.
        self.transaction = conf.transaction(alias)
        #: What becomes of a hold that outlived its owner: "release" or "warn".
        self.leaked = conf.leaked(alias)
        #: The bound of a watchdog hold, in seconds, for locks made without one.
        self.max_hold = conf.max_hold(alias)
        options = params.get("OPTIONS", {})
        if not isinstance(options, dict):
            raise LockSettingError(
                f"RLOCKS[{alias!r}]['OPTIONS'] must be a dict, not {type(options).__name__}",
                check_id="django_rlock.E003",
            )
        self.options: dict[str, Any] = options
        #: Subscribed to every lock client this backend builds (see :meth:`reporting`).
        self.reporter = Reporter(self)
        #: Recent hold durations: the honest Retry-After of a busy view or task.
        self.hold_times = HoldTimes()
        self._build_lock = threading.Lock()
        forking.renew_after_fork(self, "_build_lock")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} alias={self.alias!r} prefix={self.key_prefix!r}>"

    def _check_options(self, accepted: Mapping[str, object], what: str) -> None:
        """Refuse ``OPTIONS`` keys not in ``accepted`` (a typo must not be ignored).

        ``accepted`` maps each option to its default; ``what`` names what takes
        them. A backend calls it once its own settings are read.
        """
        conf.check_options(self.alias, self.options, accepted, what)

    @abstractmethod
    def lock(self, name: str, **options: Unpack[LockOptions]) -> AliasLock:
        """A reentrant lock called ``name``, as :meth:`LockClient.lock` makes one.

        The keywords (:class:`~django_rlock.core._protocol.lock.LockOptions`: ``timeout``,
        ``lease``, ``blocking``, ``max_hold``) are the defaults ``with lock:``
        uses; a ``max_hold`` of None takes the alias's ``MAX_HOLD``. The lock
        sends the lock signals and writes the slow-lock log. Every other kind's
        factory below takes the same keywords.
        """

    def async_lock(self, name: str, **options: Unpack[LockOptions]) -> AsyncLock:
        """The lock ``name`` for asyncio code (``async with``), owned by the current task.

        This default enters and releases :meth:`lock` on a worker thread of its
        own; backends with a native asyncio lock return that instead.
        """
        return ThreadOwnedLock(self.lock(name, **options))

    def semaphore(self, name: str, permits: int, **options: Unpack[LockOptions]) -> AliasSemaphore:
        """A semaphore of ``permits`` permits called ``name``, as :meth:`LockClient.semaphore`.

        ``timeout``, ``lease`` and ``blocking`` are the defaults ``with`` uses.
        A backend with no semaphores raises NotImplementedError saying so.
        """
        raise NotImplementedError(
            f"the {type(self).__name__} of RLOCKS[{self.alias!r}] has no semaphores"
        )

    def async_semaphore(self, name: str, permits: int, **options: Unpack[LockOptions]) -> AsyncLock:
        """The semaphore ``name`` for asyncio code, as :meth:`async_lock` is the lock's."""
        return ThreadOwnedLock(self.semaphore(name, permits, **options))

    def fair_lock(self, name: str, **options: Unpack[LockOptions]) -> AliasFairLock:
        """A reentrant lock called ``name`` granted in arrival order (:meth:`LockClient.fair_lock`).

        The keywords are ``with``'s defaults, as for :meth:`lock`. A fair lock
        and a plain lock of the same name are two different locks. A backend
        with no fair locks raises NotImplementedError saying so.
        """
        raise NotImplementedError(
            f"the {type(self).__name__} of RLOCKS[{self.alias!r}] has no fair locks"
        )

    def async_fair_lock(self, name: str, **options: Unpack[LockOptions]) -> AsyncLock:
        """The fair lock ``name`` for asyncio code, as :meth:`async_lock` is the lock's."""
        return ThreadOwnedLock(self.fair_lock(name, **options))

    def read_write_lock(self, name: str, **options: Unpack[LockOptions]) -> AliasReadWriteLock:
        """Many readers or one writer, called ``name``: ``.read`` and ``.write``.

        As :meth:`LockClient.read_write_lock`; the keywords are both sides'
        defaults for ``with``. A backend with no read-write locks raises
        NotImplementedError saying so.
        """
        raise NotImplementedError(
            f"the {type(self).__name__} of RLOCKS[{self.alias!r}] has no read-write locks"
        )

    def async_read_write_lock(
        self, name: str, **options: Unpack[LockOptions]
    ) -> AsyncReadWriteLock:
        """The read-write lock ``name`` for asyncio code: each side owned by the current task.

        This default runs :meth:`read_write_lock`'s sides on a worker thread of
        the task's own (as :meth:`async_lock` does); backends with a native
        asyncio engine return that instead.
        """
        return ThreadOwnedReadWriteLock(self.read_write_lock(name, **options))

    def rate_limiter(self, name: str, rate: str, burst: int | None = None) -> AliasRateLimiter:
        """A global rate limit called ``name`` (:meth:`LockClient.rate_limiter`).

        ``rate`` is ``"N/s"``, ``"N/m"``, ``"N/h"`` or ``"N/d"``; ``burst`` (default
        N) how many may be taken at once after idling. A backend with no rate
        limiters raises NotImplementedError saying so.
        """
        raise NotImplementedError(
            f"the {type(self).__name__} of RLOCKS[{self.alias!r}] has no rate limiters"
        )

    def async_rate_limiter(self, name: str, rate: str, burst: int | None = None) -> AsyncLimiter:
        """The rate limiter ``name`` for asyncio code (every call awaited).

        This default runs :meth:`rate_limiter`'s calls on worker threads;
        backends with a native asyncio engine return that instead.
        """
        return ThreadRateLimiter(self.rate_limiter(name, rate, burst))

    def inspect_rate_limiter(self, name: str) -> LimiterState | None:
        """What rate limiter ``name`` has left; None when its whole burst is available."""
        return None

    @abstractmethod
    def names(self, pattern: str = "*") -> Iterator[str]:
        """Names of the locks held now whose name matches the glob ``pattern``."""

    @abstractmethod
    def inspect(self, name: str) -> LockInfo | None:
        """Holders, TTL and fencing token of lock ``name``; None when nobody holds it."""

    def force_release(self, name: str) -> bool:
        """Delete lock ``name`` whoever holds it; True if it was held."""
        return self.lock(name).force_release()

    def maxmemory_policy(self) -> str | None:
        """The server's ``maxmemory-policy`` (asks the server); None when not Redis."""
        return None

    def close(self) -> None:  # noqa: B027 -- a backend with no connections has nothing to close
        """Release this backend's connections (held locks expire, as on process exit)."""
