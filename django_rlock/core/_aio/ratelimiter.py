"""AsyncRateLimiter: the asyncio twin of :mod:`django_rlock.core._sync.ratelimiter`.

::

    client = AsyncLockClient("redis://127.0.0.1:6379/0")
    partner = client.rate_limiter("partner-api:tenant-7", "100/m")

    if await partner.try_acquire():
        ...
    await partner.acquire()            # sleeps (asyncio.sleep) until a permit is due

The same names, arguments and scripts, awaited. A task cancelled while it
sleeps for its permits leaves them used (the limiter errs towards fewer grants).
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from redis.exceptions import OutOfMemoryError

from django_rlock.core._protocol.lock import ScriptRegistry
from django_rlock.core._protocol.ratelimit import (
    RateLimiterBase,
    RateLimiterScripts,
    Reservation,
    reservation,
)
from django_rlock.core._protocol.unavailable import reported_unavailable


class Client(Protocol):
    """What an asyncio rate limiter needs of its :class:`~django_rlock.core.aio.AsyncLockClient`."""

    key_prefix: str
    server: str
    scripts: ScriptRegistry


class AsyncRateLimiter(RateLimiterBase):
    """The asyncio :class:`~django_rlock.core._sync.ratelimiter.RateLimiter`: every call awaited."""

    def __init__(self, client: Client, name: str, rate: object, *, burst: object = None) -> None:
        super().__init__(client.key_prefix, name, rate, burst)
        self.client = client
        self._scripts = client.scripts[RateLimiterScripts]

    async def try_acquire(self, permits: int = 1) -> bool:
        """Take ``permits`` if they are due now; never waits.

        Polite, as the threaded one's: a refused caller that waits :meth:`wait_time`
        and tries again gets in, also beside ``acquire()`` callers.
        """
        return (await self.reserve(permits, within=0, polite=True)).granted

    async def acquire(self, permits: int = 1, timeout: float | None = None) -> bool:
        """Take ``permits``, waiting until they are due, at most ``timeout`` seconds.

        None waits as long as it takes. False at once, with nothing taken, when
        they would be due only after ``timeout``.
        """
        reserved = await self.reserve(permits, within=timeout)
        if not reserved.granted:
            return False
        if reserved.wait > 0:
            await asyncio.sleep(reserved.wait)
        return True

    async def wait_time(self, permits: int = 1) -> float:
        """Seconds until ``try_acquire(permits)`` would be granted (0.0: now). Takes nothing.

        When it answers more than 0, that time is kept for the polite callers
        (unless a place is kept already), so trying again after it gets in.
        """
        call = self._wait_call(permits)
        with reported_unavailable(self.client.server, self._action()):
            wait = await self._scripts.wait(keys=call.keys, args=call.args)
        return int(wait) / 1_000_000

    async def reserve(
        self, permits: int = 1, *, within: float | None = None, polite: bool = False
    ) -> Reservation:
        """Take ``permits`` if they are due within ``within`` seconds (None: whenever due).

        As :meth:`RateLimiter.reserve <django_rlock.core._sync.ratelimiter.RateLimiter.reserve>`.
        """
        call = self._reserve_call(permits, within, polite)
        try:
            with reported_unavailable(self.client.server, self._action()):
                reply = await self._scripts.reserve(keys=call.keys, args=call.args)
        except OutOfMemoryError as error:
            raise self._out_of_memory_error(error) from error
        return reservation(reply)
