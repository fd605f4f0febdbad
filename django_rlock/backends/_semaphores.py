"""The semaphores a backend hands out: the engine's own, with an alias attached.

As :mod:`django_rlock.backends._locks` is for locks: :class:`AliasSemaphore` is the
engine's :class:`~django_rlock.core.Semaphore` plus ``backend`` (whose
reporter turns its hold events into signals, metrics and slow-lock log lines),
``location``, ``key_template`` and ``async with``, which takes the backend's
asyncio twin, owned by the current task. :class:`AsyncAliasSemaphore` is the
same over :class:`~django_rlock.core.aio.AsyncSemaphore`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django_rlock.backends._locks import AsyncWithTwin
from django_rlock.backends._types import AliasAttached
from django_rlock.core import Semaphore
from django_rlock.core.aio import AsyncSemaphore

if TYPE_CHECKING:
    from django_rlock.backends._types import AsyncLock


class AliasSemaphore(AsyncWithTwin, Semaphore):
    """A :class:`Semaphore` of one ``RLOCKS`` alias; see the module."""

    _noun = "semaphore"

    def _async_twin(self) -> AsyncLock:
        return self.backend.async_semaphore(self.name, self.permits, **self._defaults())


class AsyncAliasSemaphore(AliasAttached, AsyncSemaphore):
    """An :class:`AsyncSemaphore` of one ``RLOCKS`` alias; see the module."""
