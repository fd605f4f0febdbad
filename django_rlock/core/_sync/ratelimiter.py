"""RateLimiter: a global rate limit per name, for threads (protocol: ``_protocol/ratelimit.py``).

::

    client = LockClient("redis://127.0.0.1:6379/0")
    partner = client.rate_limiter("partner-api:tenant-7", "100/m")   # burst 100

    if partner.try_acquire():          # never waits
        call_partner()
    partner.acquire()                  # waits exactly until a permit is due
    partner.acquire(3, timeout=2.0)    # three at once, if due within 2 s (else False)
    partner.wait_time()                # seconds until one would be granted (0.0: now)

Every process using the same server and name shares the limit; the server's
clock decides. ``acquire`` reserves its permits when they are due within its
``timeout`` and sleeps until then (no polling, no retry storm); past the
timeout it returns False at once, having taken nothing. Its asyncio twin is
:mod:`django_rlock.core._aio.ratelimiter`.
"""

from __future__ import annotations

import time
from typing import Protocol

import redis
from redis.exceptions import OutOfMemoryError

from django_rlock.core._protocol.lock import ScriptRegistry
from django_rlock.core._protocol.ratelimit import (
    LimiterState,
    RateLimiterBase,
    RateLimiterScripts,
    Reservation,
    limiter_key,
    limiter_state,
    reservation,
    state_call,
)
from django_rlock.core._protocol.unavailable import reported_unavailable


class Client(Protocol):
    """What a rate limiter needs of its :class:`~django_rlock.core.LockClient`."""

    key_prefix: str
    server: str
    scripts: ScriptRegistry

    def held(self) -> redis.Redis | None:
        """The calling thread's connection for script calls (None: the pool's)."""
        ...


class RateLimiter(RateLimiterBase):
    """``rate`` permits per period for the name, across every process; see the module.

    Made by :meth:`LockClient.rate_limiter <django_rlock.core.LockClient.rate_limiter>`.
    ``rate`` is ``"N/s"``, ``"N/m"``, ``"N/h"`` or ``"N/d"``; ``burst`` (default N)
    is how many may be taken at once after idling. Over any window of ``T``
    seconds, at most ``burst + N x T / period`` permits are granted.
    """

    def __init__(self, client: Client, name: str, rate: object, *, burst: object = None) -> None:
        super().__init__(client.key_prefix, name, rate, burst)
        self.client = client
        self._scripts = client.scripts[RateLimiterScripts]

    def try_acquire(self, permits: int = 1) -> bool:
        """Take ``permits`` if they are due now; never waits.

        Polite: a refused caller that waits :meth:`wait_time` and tries again
        gets in, also beside ``acquire()`` callers (the polite callers share
        one place in the queue; see docs/rate-limits.md).
        """
        return self.reserve(permits, within=0, polite=True).granted

    def acquire(self, permits: int = 1, timeout: float | None = None) -> bool:
        """Take ``permits``, waiting until they are due, at most ``timeout`` seconds.

        None waits as long as it takes. False at once, with nothing taken, when
        they would be due only after ``timeout``.
        """
        reserved = self.reserve(permits, within=timeout)
        if not reserved.granted:
            return False
        if reserved.wait > 0:
            time.sleep(reserved.wait)
        return True

    def wait_time(self, permits: int = 1) -> float:
        """Seconds until ``try_acquire(permits)`` would be granted (0.0: now). Takes nothing.

        When it answers more than 0, that time is kept for the polite callers
        (unless a place is kept already), so trying again after it gets in.
        """
        call = self._wait_call(permits)
        with reported_unavailable(self.client.server, self._action()):
            wait = self._scripts.wait(keys=call.keys, args=call.args, client=self.client.held())
        return int(wait) / 1_000_000

    def reserve(
        self, permits: int = 1, *, within: float | None = None, polite: bool = False
    ) -> Reservation:
        """Take ``permits`` if they are due within ``within`` seconds (None: whenever due).

        Returns whether they were taken and the seconds until they are due;
        the caller must not use them before (``acquire`` sleeps that long).
        What Celery's ``lock_rate`` re-queues a task with. ``polite=True``
        (with ``within=0``) is :meth:`try_acquire`'s: it takes the polite
        callers' place when due, and keeps it when refused.
        """
        call = self._reserve_call(permits, within, polite)
        try:
            with reported_unavailable(self.client.server, self._action()):
                reply = self._scripts.reserve(
                    keys=call.keys, args=call.args, client=self.client.held()
                )
        except OutOfMemoryError as error:
            raise self._out_of_memory_error(error) from error
        return reservation(reply)


def read_limiter_state(client: Client, name: str) -> LimiterState | None:
    """The state of rate limiter ``name`` (checked) on ``client``; None when its bucket is full."""
    call = state_call(limiter_key(client.key_prefix, name))
    with reported_unavailable(client.server, f"inspect rate limiter {name!r}"):
        reply = client.scripts[RateLimiterScripts].state(keys=call.keys, args=call.args)
    return limiter_state(name, reply)
