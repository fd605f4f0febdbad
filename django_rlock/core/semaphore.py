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
the rules of the scripts are in :mod:`django_rlock.core.semaphore_scripts`.

Every call counts against the ``permits`` of the object it is made on: use one
number per name (objects with different numbers each stop at their own).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Unpack

from django_rlock.core import lostholds
from django_rlock.core.calls import ScriptCall, hold_count_reply
from django_rlock.core.exceptions import LockLostError, LockTimeout
from django_rlock.core.holder import describe
from django_rlock.core.identity import thread_owner
from django_rlock.core.lock import KindScripts, LockBase, LockOptions, RLock, gave_up_after
from django_rlock.core.semaphore_scripts import (
    check_permits,
    permit_key,
    semaphore_abandon_call,
    semaphore_acquire_call,
    semaphore_force_release_call,
    semaphore_keys,
    semaphore_release_call,
    semaphore_state_call,
)

if TYPE_CHECKING:
    from django_rlock.core.client import LockClient

__all__ = ["Semaphore", "SemaphoreBase", "available_reply", "first_return_reply"]


def available_reply(permits: int, state: Any) -> int:
    """Free permits, from a state script reply ``{used, soonest}`` (never below 0)."""
    return max(permits - int(state[0]), 0)


def first_return_reply(state: Any) -> float | None:
    """Seconds until the first held permit may come back (None: none held; inf: no expiry)."""
    soonest = int(state[1])
    if soonest == -2:
        return None
    if soonest == -1:
        return float("inf")
    return soonest / 1000


class SemaphoreBase(LockBase):
    """What :class:`Semaphore` and the asyncio ``AsyncSemaphore`` share (no I/O).

    The keys (``keys.hash`` is the index of owners holding permits), each
    owner's permit hash as the key its holds are counted and renewed in, and
    the script calls.
    """

    def __init__(
        self, client: Any, name: str, permits: int, **options: Unpack[LockOptions]
    ) -> None:
        # `client` is the shell's (LockClient or AsyncLockClient): the shell
        # class after this one in the MRO takes it and finds the engine.
        self.permits = check_permits(permits)
        super().__init__(client, name, **options)
        self.keys = semaphore_keys(self._engine.key_prefix, name)

    def hold_keys(self, owner: str) -> tuple[str, str]:
        """The owner's permit hash, and the never-written fence renewed with it (a no-op)."""
        return permit_key(self.keys, owner), self.keys.fence

    def _acquire_call(
        self, owner: str, lease: float | None, waiter_id: str, sleep: float
    ) -> ScriptCall:
        rid = self._request_id("acquire", owner)
        lost = lostholds.lost_on_server(self.hold_keys(owner)[0], owner) is not None
        return semaphore_acquire_call(
            self.keys,
            owner,
            permits=self.permits,
            ttl=self._ttl_of(lease),
            waiter_id=waiter_id,
            sleep=sleep,
            rid=rid,
            lost=lost,
            holder=describe(),
        )

    def _release_call(self, owner: str) -> ScriptCall:
        rid = self._request_id("release", owner)
        return semaphore_release_call(self.keys, owner, self._engine.publish_command, rid)

    def _abandon_call(self, waiter_id: str) -> ScriptCall:
        return semaphore_abandon_call(
            self.keys, waiter_id, self._engine.publish_command, self.permits
        )

    def _state_call(self) -> ScriptCall:
        return semaphore_state_call(self.keys)

    def _force_release_call(self) -> ScriptCall:
        return semaphore_force_release_call(self.keys, self._engine.publish_command)

    def _timeout_error(self, remaining: float | None) -> LockTimeout:
        return LockTimeout(
            f"could not acquire a permit of semaphore {self.name!r} (permits={self.permits}) "
            f"{gave_up_after(self.blocking, self.timeout)}"
            + ("" if remaining is None else f" (the first may come back in {remaining:.3f}s)"),
            name=self.name,
            retry_after=remaining,
        )

    def _lost_error(self) -> LockLostError:
        return LockLostError(
            f"a permit of semaphore {self.name!r} was lost: it expired before release",
            name=self.name,
        )

    @property
    def token(self) -> None:
        """Always None: permits carry no fencing token (several holders run at once)."""
        return None


class Semaphore(SemaphoreBase, RLock):
    """A distributed semaphore with watchdog permits; get one from :meth:`LockClient.semaphore`.

    ``acquire``/``release``/``with`` take and give back one permit of the
    calling thread; ``lost``, ``on_lost``, ``extend`` and ``hold_count`` are
    the lock's, about the thread's permits.
    """

    def __init__(
        self, client: LockClient, name: str, permits: int, **options: Unpack[LockOptions]
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
        return KindScripts.of(self.client.semaphore_scripts)

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
        owner = thread_owner()
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
            return self.client.semaphore_scripts.state(keys=call.keys, args=call.args)

    def _first_return(self) -> float | None:
        return first_return_reply(self._state())
