"""An async face for a backend whose locks are owned by threads (LocMem).

Backends with a native asyncio lock (Redis) hand out
:class:`~django_rlock.core.aio.AsyncRLock` objects; the others get this
adapter, which enters and releases one sync lock on one worker thread of its
own, so the owner stays the same thread for the whole hold and the event loop
never blocks.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Any, Self

from django_rlock.core.lock import RLock

__all__ = ["ThreadOwnedLock"]


class ThreadOwnedLock:
    """``async with`` over a sync lock, entered and released on one dedicated thread."""

    def __init__(self, lock: RLock) -> None:
        self.lock = lock
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlock-async")

    @property
    def name(self) -> str:
        """The lock's name."""
        return self.lock.name

    async def __aenter__(self) -> Self:
        future = self._executor.submit(self.lock.__enter__)
        try:
            await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            # The wait goes on in its thread; a hold it ends in is given back.
            future.add_done_callback(self._release_if_held)
            raise
        except BaseException:
            self._executor.shutdown(wait=False)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            await asyncio.shield(asyncio.wrap_future(self._executor.submit(self.lock.release)))
        finally:
            self._executor.shutdown(wait=False)

    def _release_if_held(self, future: Future[Any]) -> None:
        if not future.cancelled() and future.exception() is None:
            self._executor.submit(self.lock.release)
        self._executor.shutdown(wait=False)
