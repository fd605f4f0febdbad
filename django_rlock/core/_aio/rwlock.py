"""AsyncReadWriteLock: the asyncio twin of :class:`django_rlock.core._sync.rwlock.ReadWriteLock`.

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

from typing import Unpack

from django_rlock.core._aio.locks import AsyncRLock
from django_rlock.core._aio.shell import Client
from django_rlock.core._process.identity import task_owner
from django_rlock.core._protocol.calls import hold_count_reply, ttl_reply
from django_rlock.core._protocol.lock import LockOptions
from django_rlock.core._protocol.rwlock import ReadSide, ReadWriteBase, RWScripts, WriteSide


class AsyncWriteLock(WriteSide, AsyncRLock):
    """The write side of an :class:`AsyncReadWriteLock` (see the sync ``WriteLock``)."""


class AsyncReadLock(ReadSide, AsyncRLock):
    """The read side of an :class:`AsyncReadWriteLock` (see the sync ``ReadLock``)."""

    async def _readers(self) -> tuple[int, int]:
        call = self._readers_call()
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


class AsyncReadWriteLock(ReadWriteBase):
    """Many readers or one writer, for asyncio; get one from ``AsyncLockClient.read_write_lock``."""

    def __init__(
        self,
        client: Client,
        name: str,
        scripts: RWScripts,
        **options: Unpack[LockOptions],
    ) -> None:
        keys = self._build_keys(client.engine.min_replicas, client.key_prefix, name)
        #: The shared side: many tasks at once while nobody else writes.
        self.read = AsyncReadLock(client, keys, scripts, **options)
        #: The exclusive side: one task, and no reader but that task.
        self.write = AsyncWriteLock(client, keys, scripts, **options)
