"""The semaphores a backend hands out: the engine's own, with an alias attached.

As :mod:`django_rlock._aliaslocks` is for locks: :class:`AliasSemaphore` is the
engine's :class:`~django_rlock.core.Semaphore` plus ``backend`` (whose
reporter turns its hold events into signals, metrics and slow-lock log lines),
``location``, ``key_template`` and ``async with``, which takes the backend's
asyncio twin, owned by the current task. :class:`AsyncAliasSemaphore` is the
same over :class:`~django_rlock.core.aio.AsyncSemaphore`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Unpack

from django_rlock._aliasfamily import (
    AliasFairLock,
    AliasReadLock,
    AliasWriteLock,
    AsyncAliasFairLock,
    AsyncAliasReadLock,
    AsyncAliasWriteLock,
)
from django_rlock._aliaslocks import (
    AliasAttached,
    AliasBackend,
    AliasLock,
    AsyncAliasLock,
    AsyncWithTwin,
)
from django_rlock.core._aio.client import AsyncLockClient
from django_rlock.core._aio.semaphore import AsyncSemaphore
from django_rlock.core._protocol.lock import LockOptions
from django_rlock.core._sync.client import LockClient
from django_rlock.core._sync.semaphore import Semaphore

if TYPE_CHECKING:
    from django_rlock._handles import AsyncLock


class AliasSemaphore(AsyncWithTwin, Semaphore):
    """A :class:`Semaphore` of one ``RLOCKS`` alias; see the module."""

    _noun = "semaphore"

    def __init__(
        self,
        client: LockClient,
        name: str,
        permits: int,
        backend: AliasBackend,
        **options: Unpack[LockOptions],
    ) -> None:
        super().__init__(client, name, permits, **options)
        self._attach(backend)

    def _async_twin(self) -> AsyncLock:
        return self.backend.async_semaphore(self.name, self.permits, **self._defaults())


class AsyncAliasSemaphore(AliasAttached, AsyncSemaphore):
    """An :class:`AsyncSemaphore` of one ``RLOCKS`` alias; see the module."""

    def __init__(
        self,
        client: AsyncLockClient,
        name: str,
        permits: int,
        backend: AliasBackend,
        **options: Unpack[LockOptions],
    ) -> None:
        super().__init__(client, name, permits, **options)
        self._attach(backend)


#: Whatever a backend hands out that reports its holds (signals, slow log,
#: hold times, metrics): its locks, semaphores, fair locks and both sides of
#: its read-write locks, sync and asyncio.
AnyAliasLock = (
    AliasLock
    | AsyncAliasLock
    | AliasSemaphore
    | AsyncAliasSemaphore
    | AliasFairLock
    | AsyncAliasFairLock
    | AliasReadLock
    | AsyncAliasReadLock
    | AliasWriteLock
    | AsyncAliasWriteLock
)
