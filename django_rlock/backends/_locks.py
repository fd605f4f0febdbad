"""The locks a backend hands out: the engine's own, with an alias attached.

:class:`AliasLock` is the engine's :class:`~django_rlock.core.RLock` (it adds no
state to a hold and overrides no acquire or release) plus what only the
Django face knows:

* ``backend``, the alias's backend, whose :class:`~django_rlock._observers.reporting.Reporter`
  turns the engine's hold events into signals and slow-lock log lines;
* ``location``, the code that takes the lock, for the slow-lock log (``@locked``
  sets the decorated function's; otherwise it is read from the call stack);
* ``key_template``, the template the name was built from (``"order:{order_id}"``,
  set by ``@locked`` and Celery's locked tasks; None for a name given as it
  is), the ``lock`` label of the metrics (:mod:`django_rlock._observers.metrics`);
* ``transaction``, ``"auto"`` or ``"ignore"`` (the alias's ``TRANSACTION``
  unless ``rlock()`` or ``@locked`` says otherwise): whether the end of a
  ``with`` block inside an atomic block waits for the transaction's end
  (:mod:`django_rlock._scopes.transactions`);
* ``max_hold``, when the lock was made without one: the alias's ``MAX_HOLD``;
* ``async with``, which takes the backend's asyncio twin of the lock, owned by
  the current task, and yields that.

:class:`AsyncAliasLock` is the same over the asyncio engine's
:class:`~django_rlock.core.aio.AsyncRLock`. An alias with ``"LAYOUT": "redisson"``
hands out :class:`RedissonAliasLock` and :class:`AsyncRedissonAliasLock`: the
same, on Redisson's keys (docs/redisson.md).
"""

from __future__ import annotations

import asyncio
import weakref
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

from django_rlock._callsite import caller_location
from django_rlock._scopes.transactions import end_block
from django_rlock.backends._types import AliasAttached
from django_rlock.core import RLock
from django_rlock.core._faces import AsyncRedissonRLock, LockOptions, RedissonRLock
from django_rlock.core.aio import AsyncRLock

if TYPE_CHECKING:
    from django_rlock.backends._types import AsyncLock


class AsyncWithTwin(AliasAttached):
    """``async with`` on a sync alias lock: the backend's asyncio twin, owned by the current task.

    A sibling names its twin in :meth:`_async_twin` (a lock's, a semaphore's)
    and what it is in ``_noun`` (for the error outside a task).
    """

    _noun = "lock"

    #: Per task, the asyncio twins entered through this object (nested: a
    #: stack); made on the first ``async with``, as most objects never see one.
    _twins: weakref.WeakKeyDictionary[asyncio.Task[Any], list[AsyncLock]] | None = None

    def _async_twin(self) -> AsyncLock:
        """The backend's asyncio lock of the same name and ``with`` defaults."""
        raise NotImplementedError

    def _defaults(self) -> LockOptions:
        """The lock's ``with`` defaults, for its asyncio twin."""
        lock = cast(RLock, self)  # mixed into RLock subclasses only
        return LockOptions(
            timeout=lock.timeout, lease=lock.lease, blocking=lock.blocking, max_hold=lock.max_hold
        )

    async def __aenter__(self) -> AsyncLock:
        twin = self._async_twin()
        if isinstance(twin, AliasAttached) and twin.location is None:
            # Here, in the caller's task: the asyncio engine grants in a task of
            # its own, whose stack no longer shows who asked.
            twin.location = self.location
            twin.key_template = self.key_template
            backend = self.backend
            if twin.location is None and (
                backend.slow_wait is not None or backend.slow_hold is not None
            ):
                twin.location = caller_location()
        entered = await twin.__aenter__()
        twins = self._twins
        if twins is None:
            # setdefault: one object may be entered on several event loops' threads.
            twins = self.__dict__.setdefault("_twins", weakref.WeakKeyDictionary())
        twins.setdefault(self._current_task(), []).append(twin)
        return entered

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        # Mixed into RLock subclasses only (AliasLock, AliasSemaphore, ...).
        end_block(cast(RLock, self), self.transaction)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        task = self._current_task()
        twins = self._twins
        if twins is None:
            raise KeyError(task)  # as for a task that entered nothing: no __aenter__ ran
        stack = twins[task]
        twin = stack.pop()
        if not stack:
            del twins[task]
        await twin.__aexit__(exc_type, exc, traceback)

    def _current_task(self) -> asyncio.Task[Any]:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError(f"async with on a {self._noun} must run inside an asyncio task")
        return task


class AliasLock(AsyncWithTwin, RLock):
    """An :class:`RLock` of one ``RLOCKS`` alias; see the module.

    Built as the engine's (``AliasLock(client, name, backend=backend, **options)``).
    """

    def _async_twin(self) -> AsyncLock:
        return self.backend.async_lock(self.name, **self._defaults())


class AsyncAliasLock(AliasAttached, AsyncRLock):
    """An :class:`AsyncRLock` of one ``RLOCKS`` alias; see the module."""


class RedissonAliasLock(AliasLock, RedissonRLock):
    """An :class:`AliasLock` of an alias with ``"LAYOUT": "redisson"`` (Redisson's RLock)."""


class AsyncRedissonAliasLock(AsyncAliasLock, AsyncRedissonRLock):
    """An :class:`AsyncAliasLock` of an alias with ``"LAYOUT": "redisson"``."""
