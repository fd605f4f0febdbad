"""AsyncSemaphore: the asyncio twin of :class:`django_rlock.core._sync.semaphore.Semaphore`.

Same scripts and keys: sync and async owners share the permits of one name.
The owner is the current asyncio task; cancellation is as safe as for
:class:`~django_rlock.core.aio.AsyncRLock` (a permit granted as its acquire
was cancelled is given back; a cancelled release still completes)::

    client = AsyncLockClient("redis://127.0.0.1:6379/0")
    async with client.semaphore("partner-api:tenant-7", permits=3):
        await call_partner()
"""

from __future__ import annotations

from typing import Any, Self, Unpack

from django_rlock.core._aio.locks import AsyncRLock
from django_rlock.core._aio.shell import Client
from django_rlock.core._process.identity import task_owner
from django_rlock.core._protocol.calls import hold_count_reply
from django_rlock.core._protocol.lock import KindScripts, LockOptions
from django_rlock.core._protocol.semaphore import (
    SemaphoreBase,
    SemaphoreScripts,
    available_reply,
    first_return_reply,
    permit_key,
)


class AsyncSemaphore(SemaphoreBase, AsyncRLock):
    """A semaphore with watchdog permits for asyncio; get one from ``AsyncLockClient.semaphore``."""

    def __init__(
        self, client: Client, name: str, permits: int, **options: Unpack[LockOptions]
    ) -> None:
        super().__init__(client, name, permits, **options)

    def __repr__(self) -> str:
        return f"<AsyncSemaphore {self.name!r} permits={self.permits}>"

    def _kind_scripts(self) -> KindScripts:
        return KindScripts.of(self.client.scripts[SemaphoreScripts])

    async def __aenter__(self) -> Self:
        if not await self.acquire(self.blocking, self.timeout, self.lease):
            raise self._timeout_error(await self.ttl())
        return self

    # -- inspecting ---------------------------------------------------------------

    async def available(self) -> int:
        """How many permits are free now; see :meth:`Semaphore.available`."""
        return available_reply(self.permits, await self._state())

    async def locked(self) -> bool:
        """True when no permit is free."""
        return await self.available() == 0

    async def owned(self) -> bool:
        """True when the current task holds a permit (asks Redis)."""
        return await self.hold_count() > 0

    async def hold_count(self) -> int:
        """How many permits the current task holds (0 when none; asks Redis)."""
        owner = task_owner()
        with self._reachable("inspect"):
            return hold_count_reply(
                await self.client.redis.hget(permit_key(self.keys, owner), owner)
            )

    async def ttl(self) -> float | None:
        """Seconds until the first held permit may come back; None when none is held."""
        return first_return_reply(await self._state())

    async def force_release(self) -> bool:
        """Take back every permit and wake every waiter; see :meth:`Semaphore.force_release`."""
        return await super().force_release()

    async def _state(self) -> Any:
        call = self._state_call()
        with self._reachable("inspect"):
            return await self.client.scripts[SemaphoreScripts].state(keys=call.keys, args=call.args)
