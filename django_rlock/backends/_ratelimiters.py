"""The rate limiters a backend hands out: the engine's own, with an alias attached.

:class:`AliasRateLimiter` is the engine's
:class:`~django_rlock.core._sync.ratelimiter.RateLimiter` plus ``backend`` and
``key_template`` (the template the name was built from, set by
``@rate_limited`` and Celery's ``lock_rate``; None for a name given as it is):
every call it holds back is counted in ``django_rlock_throttled_total`` under
that template (:mod:`django_rlock._observers.metrics`). :class:`AsyncAliasRateLimiter` is
the same over the asyncio engine's limiter, and :class:`ThreadRateLimiter` runs
a sync one on worker threads for an alias without the asyncio engine.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from django_rlock._observers.reporting import reporter_of
from django_rlock.core import LockClient, RateLimiter
from django_rlock.core._faces import Reservation
from django_rlock.core.aio import AsyncLockClient, AsyncRateLimiter


class AsyncLimiter(Protocol):
    """What async code gets of an alias's rate limiter (native asyncio, or on threads)."""

    name: str
    key_template: str | None

    async def try_acquire(self, permits: int = 1) -> bool:
        """Take ``permits`` if they are due now."""
        ...

    async def acquire(self, permits: int = 1, timeout: float | None = None) -> bool:
        """Take ``permits``, waiting until they are due, at most ``timeout`` seconds."""
        ...

    async def wait_time(self, permits: int = 1) -> float:
        """Seconds until ``permits`` would be granted."""
        ...

    async def reserve(
        self, permits: int = 1, *, within: float | None = None, polite: bool = False
    ) -> Reservation:
        """Take ``permits`` if they are due within ``within`` seconds (polite: a try)."""
        ...


def count_held_back(backend: object, template: str | None, reserved: Reservation) -> None:
    """Count ``reserved`` in the alias's metrics when it held its caller back."""
    if reserved.granted and reserved.wait <= 0:
        return
    reporter = reporter_of(backend)
    if reporter is not None and reporter.metrics is not None:
        outcome = "delayed" if reserved.granted else "refused"
        reporter.metrics.count_throttled(template, outcome)


class AliasRateLimiter(RateLimiter):
    """A :class:`RateLimiter` of one ``RLOCKS`` alias; see the module."""

    def __init__(
        self, client: LockClient, name: str, rate: object, backend: object, *, burst: object = None
    ) -> None:
        super().__init__(client, name, rate, burst=burst)
        self.backend = backend
        self.key_template: str | None = None

    def reserve(
        self, permits: int = 1, *, within: float | None = None, polite: bool = False
    ) -> Reservation:
        """As the engine's, counted when it holds the caller back."""
        reserved = super().reserve(permits, within=within, polite=polite)
        count_held_back(self.backend, self.key_template, reserved)
        return reserved


class AsyncAliasRateLimiter(AsyncRateLimiter):
    """An :class:`AsyncRateLimiter` of one ``RLOCKS`` alias; see the module."""

    def __init__(
        self,
        client: AsyncLockClient,
        name: str,
        rate: object,
        backend: object,
        *,
        burst: object = None,
    ) -> None:
        super().__init__(client, name, rate, burst=burst)
        self.backend = backend
        self.key_template: str | None = None

    async def reserve(
        self, permits: int = 1, *, within: float | None = None, polite: bool = False
    ) -> Reservation:
        """As the engine's, counted when it holds the caller back."""
        reserved = await super().reserve(permits, within=within, polite=polite)
        count_held_back(self.backend, self.key_template, reserved)
        return reserved


class ThreadRateLimiter:
    """A sync :class:`AliasRateLimiter` for async code: each call on a worker thread.

    A limiter has no owner, so any thread will do; a reservation's wait is
    slept with ``asyncio.sleep``, not on the thread.
    """

    def __init__(self, limiter: AliasRateLimiter) -> None:
        self.limiter = limiter
        self.name = limiter.name

    @property
    def key_template(self) -> str | None:
        """The sync limiter's key template (the metrics' label)."""
        return self.limiter.key_template

    @key_template.setter
    def key_template(self, template: str | None) -> None:
        self.limiter.key_template = template

    async def try_acquire(self, permits: int = 1) -> bool:
        """Take ``permits`` if they are due now; never waits (polite, as the engine's)."""
        return (await self.reserve(permits, within=0, polite=True)).granted

    async def acquire(self, permits: int = 1, timeout: float | None = None) -> bool:
        """Take ``permits``, waiting until they are due, at most ``timeout`` seconds."""
        reserved = await self.reserve(permits, within=timeout)
        if not reserved.granted:
            return False
        if reserved.wait > 0:
            await asyncio.sleep(reserved.wait)
        return True

    async def wait_time(self, permits: int = 1) -> float:
        """Seconds until ``permits`` would be granted (0.0: now)."""
        return await asyncio.to_thread(self.limiter.wait_time, permits)

    async def reserve(
        self, permits: int = 1, *, within: float | None = None, polite: bool = False
    ) -> Reservation:
        """Take ``permits`` if they are due within ``within`` seconds (None: whenever)."""
        return await asyncio.to_thread(self.limiter.reserve, permits, within=within, polite=polite)
