"""AsyncReadWriteLock: the asyncio twin of :class:`django_rlock.core.rwlock.ReadWriteLock`.

Same scripts, keys and calls as the sync one (sync and async owners exclude
each other on the same name); the owner is the current asyncio task::

    report = client.read_write_lock("report:42")
    async with report.read:          # many tasks at once
        ...
    async with report.write:         # alone
        ...

Cancellation is as safe as :class:`~django_rlock.core.aio.AsyncRLock`'s: both
sides inherit its shielded calls.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Unpack

from django_rlock.core.aio.lock import AsyncRLock
from django_rlock.core.calls import hold_count_reply, ttl_reply
from django_rlock.core.identity import task_owner
from django_rlock.core.lock import LockOptions
from django_rlock.core.rwlock import ReadSide, WriteSide, check_rw_client
from django_rlock.core.rwlock_scripts import RWKeys, RWScripts, readers_call

if TYPE_CHECKING:
    from django_rlock.core.aio.client import AsyncLockClient

__all__ = ["AsyncReadLock", "AsyncReadWriteLock", "AsyncWriteLock"]


class AsyncWriteLock(WriteSide, AsyncRLock):
    """The write side of an :class:`AsyncReadWriteLock` (see the sync ``WriteLock``)."""

    def __init__(
        self,
        client: AsyncLockClient,
        keys: RWKeys,
        scripts: RWScripts,
        **options: Unpack[LockOptions],
    ) -> None:
        super().__init__(client, keys.name, **options)
        self.rw_keys = keys
        self.keys = keys.for_write()
        self._scripts = scripts

    def __repr__(self) -> str:
        return f"<AsyncWriteLock {self.name!r}>"

    def _acquire_sender(self) -> Callable[..., Awaitable[Any]]:
        return self._scripts.write_acquire  # type: ignore[no-any-return]

    def _release_sender(self) -> Callable[..., Awaitable[Any]]:
        return self._scripts.write_release  # type: ignore[no-any-return]

    async def _abandon(self, waiter_id: str) -> None:
        call = self._abandon_call(waiter_id)
        await self._scripts.abandon(keys=call.keys, args=call.args)

    async def force_release(self) -> bool:
        """Delete the write hold whoever has it and wake every waiter; True if it was held."""
        call = self._force_release_call()
        with self._reachable("force-release"):
            return bool(await self._scripts.write_force_release(keys=call.keys, args=call.args))


class AsyncReadLock(ReadSide, AsyncRLock):
    """The read side of an :class:`AsyncReadWriteLock` (see the sync ``ReadLock``)."""

    def __init__(
        self,
        client: AsyncLockClient,
        keys: RWKeys,
        scripts: RWScripts,
        **options: Unpack[LockOptions],
    ) -> None:
        super().__init__(client, keys.name, **options)
        self.rw_keys = keys
        self.keys = keys.for_read()
        self._scripts = scripts

    def __repr__(self) -> str:
        return f"<AsyncReadLock {self.name!r}>"

    def _acquire_sender(self) -> Callable[..., Awaitable[Any]]:
        return self._scripts.read_acquire  # type: ignore[no-any-return]

    def _release_sender(self) -> Callable[..., Awaitable[Any]]:
        return self._scripts.read_release  # type: ignore[no-any-return]

    async def _abandon(self, waiter_id: str) -> None:
        call = self._abandon_call(waiter_id)
        await self._scripts.abandon(keys=call.keys, args=call.args)

    async def force_release(self) -> bool:
        """Delete every reader's hold and wake every waiter; True if any reader held it."""
        call = self._force_release_call()
        with self._reachable("force-release"):
            return int(await self._scripts.read_force_release(keys=call.keys, args=call.args)) > 0

    async def _readers(self) -> tuple[int, int]:
        call = readers_call(self.rw_keys)
        with self._reachable("inspect"):
            live, longest = await self._scripts.readers(keys=call.keys, args=call.args)
        return int(live), int(longest)

    async def locked(self) -> bool:
        """True when any owner holds a read."""
        return (await self._readers())[0] > 0

    async def ttl(self) -> float | None:
        """Seconds until the longest-lived read hold expires, None when nobody reads."""
        return ttl_reply((await self._readers())[1])

    async def owned(self) -> bool:
        """True when the current task holds a read (asks Redis)."""
        owner = task_owner()
        with self._reachable("inspect"):
            return bool(await self.client.redis.hexists(self.rw_keys.reader(owner), owner))

    async def hold_count(self) -> int:
        """How many read holds the current task has (0 when none; asks Redis)."""
        owner = task_owner()
        with self._reachable("inspect"):
            count = await self.client.redis.hget(self.rw_keys.reader(owner), owner)
        return hold_count_reply(count)


class AsyncReadWriteLock:
    """Many readers or one writer, for asyncio; get one from ``AsyncLockClient.read_write_lock``."""

    def __init__(
        self,
        client: AsyncLockClient,
        name: str,
        scripts: RWScripts,
        **options: Unpack[LockOptions],
    ) -> None:
        check_rw_client(client.engine.min_replicas, name)
        keys = RWKeys.build(client.key_prefix, name)
        self.keys = keys
        #: The shared side: many tasks at once while nobody else writes.
        self.read = AsyncReadLock(client, keys, scripts, **options)
        #: The exclusive side: one task, and no reader but that task.
        self.write = AsyncWriteLock(client, keys, scripts, **options)

    @property
    def name(self) -> str:
        """The lock's name, as the caller gave it."""
        return self.keys.name

    def __repr__(self) -> str:
        return f"<AsyncReadWriteLock {self.name!r}>"
