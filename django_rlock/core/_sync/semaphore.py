"""Semaphore: Redisson's RPermitExpirableSemaphore with watchdog permits, in Python.

At most ``permits`` permits of one name are held at once, across every
process. Each permit is held by an owner (the calling thread; for
:class:`~django_rlock.core.aio.AsyncSemaphore`, the asyncio task) and kept
alive like a lock: by the watchdog (``lease=None``) for as long as its holder
lives, or for a fixed ``lease``. A holder that dies stops renewing, so its
permits come back within the watchdog timeout::

    client = LockClient("redis://127.0.0.1:6379/0")
    partner_api = client.semaphore("partner-api:tenant-7", permits=3)
    with partner_api:                 # one of 3 permits, waits as long as it takes
        call_partner()

    if partner_api.acquire(timeout=5):
        try: ...
        finally: partner_api.release()

A semaphore is an :class:`~django_rlock.core.RLock` with other scripts: the
waiting (pub/sub wake-ups, never a poll), the watchdog, loss reporting
(``lost``, ``on_lost``), lost-reply latches and holder metadata are the
lock's. A thread that takes a second permit holds two (``hold_count() == 2``)
and must release twice, as with ``threading.Semaphore``. The Redis layout and
the rules of the scripts are in :mod:`django_rlock.core._protocol.semaphore`.

Every call counts against the ``permits`` of the object it is made on: use one
number per name (objects with different numbers each stop at their own).
"""

from __future__ import annotations

from typing import Any, Unpack

from django_rlock.core._protocol.calls import hold_count_reply
from django_rlock.core._protocol.lock import KindScripts, LockOptions
from django_rlock.core._protocol.semaphore import (
    SemaphoreBase,
    SemaphoreScripts,
    available_reply,
    first_return_reply,
    permit_key,
)
from django_rlock.core._sync.locks import RLock
from django_rlock.core._sync.shell import Client


class Semaphore(SemaphoreBase, RLock):
    """A distributed semaphore with watchdog permits; get one from :meth:`LockClient.semaphore`.

    ``acquire``/``release``/``with`` take and give back one permit of the
    calling thread; ``lost``, ``on_lost``, ``extend`` and ``hold_count`` are
    the lock's, about the thread's permits.
    """

    def __init__(
        self, client: Client, name: str, permits: int, **options: Unpack[LockOptions]
    ) -> None:
        if client.min_replicas:
            raise ValueError(
                "semaphores do not support min_replicas yet: build the semaphore's client "
                f"without it (this one waits for {client.min_replicas} replicas)"
            )
        super().__init__(client, name, permits, **options)

    def __repr__(self) -> str:
        return f"<Semaphore {self.name!r} permits={self.permits}>"

    def acquire(
        self, blocking: bool = True, timeout: float | None = None, lease: float | None = None
    ) -> bool:
        """Take one permit; True when taken.

        ``blocking=False`` makes one attempt. Otherwise wait up to ``timeout``
        seconds (None: as long as it takes), woken when a permit is released
        or when the first holder's permits may expire, whichever comes first.
        ``lease`` is a fixed expiry in seconds; None means the watchdog renews
        the permit until it is released.
        """
        return super().acquire(blocking, timeout, lease)

    def release(self) -> None:
        """Give back one permit of the calling thread, waking one waiter.

        Raises :class:`~django_rlock.core.LockNotOwnedError` (changing
        nothing) when the thread holds no permit, and
        :class:`~django_rlock.core.LockLostError` when its permits expired
        before this release.
        """
        super().release()

    def _kind_scripts(self) -> KindScripts:
        return KindScripts.of(self.client.scripts[SemaphoreScripts])

    def __enter__(self) -> Semaphore:
        if not self.acquire(self.blocking, self.timeout, self.lease):
            raise self._timeout_error(self._first_return())
        return self

    # -- inspecting ---------------------------------------------------------------

    def available(self) -> int:
        """How many permits are free now (``permits`` minus those held by live holders)."""
        return available_reply(self.permits, self._state())

    def locked(self) -> bool:
        """True when no permit is free (as ``asyncio.Semaphore.locked``)."""
        return self.available() == 0

    def owned(self) -> bool:
        """True when the calling thread holds a permit (asks Redis)."""
        return self.hold_count() > 0

    def hold_count(self) -> int:
        """How many permits the calling thread holds (0 when none; asks Redis)."""
        owner = self._owner()
        with self._reachable("inspect"):
            return hold_count_reply(self.client.redis.hget(permit_key(self.keys, owner), owner))

    def ttl(self) -> float | None:
        """Seconds until the first held permit may come back; None when none is held."""
        return self._first_return()

    def force_release(self) -> bool:
        """Take back every permit, whoever holds it, and wake every waiter; True if any was held.

        For operators and recovery code: each holder learns of it at its next
        renewal or release (as a lost permit).
        """
        return super().force_release()

    def _state(self) -> Any:
        call = self._state_call()
        with self._reachable("inspect"):
            return self.client.scripts[SemaphoreScripts].state(keys=call.keys, args=call.args)

    def _first_return(self) -> float | None:
        return first_return_reply(self._state())
