"""The semaphores a backend hands out: the engine's own, with an alias attached.

As :mod:`django_rlock.aliaslocks` is for locks: :class:`AliasSemaphore` is the
engine's :class:`~django_rlock.core.Semaphore` plus ``backend`` (whose
reporter turns its hold events into signals, metrics and slow-lock log lines),
``location``, ``key_template`` and ``async with``, which takes the backend's
asyncio twin, owned by the current task. :class:`AsyncAliasSemaphore` is the
same over :class:`~django_rlock.core.aio.AsyncSemaphore`.
"""

from __future__ import annotations

import asyncio
import weakref
from types import TracebackType
from typing import TYPE_CHECKING, Any, Unpack

from django_rlock.aliaslocks import AliasLock, AsyncAliasLock
from django_rlock.callsite import caller_location
from django_rlock.core.aio.client import AsyncLockClient
from django_rlock.core.aio.semaphore import AsyncSemaphore
from django_rlock.core.client import LockClient
from django_rlock.core.lock import LockOptions
from django_rlock.core.semaphore import Semaphore

if TYPE_CHECKING:
    from django_rlock.backends.base import AsyncLock, BaseLockBackend

__all__ = ["AliasSemaphore", "AnyAliasLock", "AsyncAliasSemaphore"]


class AliasSemaphore(Semaphore):
    """A :class:`Semaphore` of one ``RLOCKS`` alias; see the module."""

    def __init__(
        self,
        client: LockClient,
        name: str,
        permits: int,
        backend: BaseLockBackend,
        **options: Unpack[LockOptions],
    ) -> None:
        super().__init__(client, name, permits, **options)
        self.backend = backend
        self.location: str | None = None
        self.key_template: str | None = None
        # Per task, the asyncio twins entered through this object (nested: a stack).
        self._twins: weakref.WeakKeyDictionary[asyncio.Task[Any], list[AsyncLock]] = (
            weakref.WeakKeyDictionary()
        )

    async def __aenter__(self) -> AsyncLock:
        backend = self.backend
        twin = backend.async_semaphore(
            self.name,
            self.permits,
            timeout=self.timeout,
            lease=self.lease,
            blocking=self.blocking,
        )
        if isinstance(twin, AsyncAliasSemaphore) and twin.location is None:
            # Here, in the caller's task: the asyncio engine grants in a task of
            # its own, whose stack no longer shows who asked.
            twin.location = self.location
            twin.key_template = self.key_template
            if twin.location is None and (
                backend.slow_wait is not None or backend.slow_hold is not None
            ):
                twin.location = caller_location()
        entered = await twin.__aenter__()
        self._twins.setdefault(_current_task(), []).append(twin)
        return entered

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        task = _current_task()
        stack = self._twins[task]
        twin = stack.pop()
        if not stack:
            del self._twins[task]
        await twin.__aexit__(exc_type, exc, traceback)


class AsyncAliasSemaphore(AsyncSemaphore):
    """An :class:`AsyncSemaphore` of one ``RLOCKS`` alias; see the module."""

    def __init__(
        self,
        client: AsyncLockClient,
        name: str,
        permits: int,
        backend: BaseLockBackend,
        **options: Unpack[LockOptions],
    ) -> None:
        super().__init__(client, name, permits, **options)
        self.backend = backend
        self.location: str | None = None
        self.key_template: str | None = None


def _current_task() -> asyncio.Task[Any]:
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("async with on a semaphore must run inside an asyncio task")
    return task


#: Whatever a backend hands out that reports its holds (signals, slow log,
#: hold times, metrics): its locks and semaphores, sync and asyncio.
AnyAliasLock = AliasLock | AsyncAliasLock | AliasSemaphore | AsyncAliasSemaphore
