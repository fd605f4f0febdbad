"""The fair locks and read-write locks a backend hands out, with an alias attached.

As :mod:`django_rlock.backends._locks` is for the plain lock, each class here is the
engine's own (it adds no state to a hold and overrides no acquire or release)
plus ``backend`` (whose reporter turns its hold events into signals, metrics,
hold times and slow-lock log lines), ``location``, ``key_template`` and, on
the sync ones, ``async with``, which takes the backend's asyncio twin, owned
by the current task::

    from django_rlock import locks

    with locks["default"].fair_lock("report:42"):        # waits its turn
        ...

    report = locks["default"].read_write_lock("report:42")
    with report.read:                                     # many readers at once
        ...
    with report.write:                                    # alone
        ...

* :class:`AliasFairLock` / :class:`AsyncAliasFairLock`: the engine's
  :class:`~django_rlock.core.FairLock` / ``AsyncFairLock``;
* :class:`AliasReadWriteLock` / :class:`AsyncAliasReadWriteLock`: ``.read`` and
  ``.write``, the engine's read and write sides (:mod:`django_rlock.core._protocol.rwlock`),
  each alias-attached; :class:`ThreadOwnedReadWriteLock` is the asyncio face of
  a backend with no native asyncio engine (each side on the task's own thread).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Unpack

from django_rlock.backends._locks import AsyncWithTwin
from django_rlock.backends._threadowned import ThreadOwnedLock
from django_rlock.backends._types import AliasAttached, AliasBackend
from django_rlock.core import FairLock, LockClient, ReadLock, ReadWriteLock, WriteLock
from django_rlock.core._faces import LockOptions, RWScripts
from django_rlock.core.aio import (
    AsyncFairLock,
    AsyncLockClient,
    AsyncReadLock,
    AsyncReadWriteLock,
    AsyncWriteLock,
)

if TYPE_CHECKING:
    from django_rlock.backends._types import AsyncLock


class AliasFairLock(AsyncWithTwin, FairLock):
    """A :class:`~django_rlock.core.FairLock` of one ``RLOCKS`` alias; see the module."""

    _noun = "fair lock"

    def _async_twin(self) -> AsyncLock:
        return self.backend.async_fair_lock(self.name, **self._defaults())


class AsyncAliasFairLock(AliasAttached, AsyncFairLock):
    """An ``AsyncFairLock`` of one ``RLOCKS`` alias; see the module."""


class _AliasSide(AsyncWithTwin):
    """What both sides of an :class:`AliasReadWriteLock` add to the engine's side."""

    #: Which side this is: the attribute of the read-write lock that holds it.
    _side: str
    name: str  # the engine's side sets it

    def _async_twin(self) -> AsyncLock:
        rw = self.backend.async_read_write_lock(self.name, **self._defaults())
        twin: AsyncLock = getattr(rw, self._side)
        return twin


class AliasReadLock(_AliasSide, ReadLock):
    """The read side of an :class:`AliasReadWriteLock`; see the module."""

    _noun = "read lock"
    _side = "read"


class AliasWriteLock(_AliasSide, WriteLock):
    """The write side of an :class:`AliasReadWriteLock`; see the module."""

    _noun = "write lock"
    _side = "write"


class AliasReadWriteLock(ReadWriteLock):
    """Many readers or one writer, of one ``RLOCKS`` alias: ``.read`` and ``.write``.

    The engine's :class:`~django_rlock.core.ReadWriteLock` (annotate with it),
    its two sides alias-attached (see the module): built here rather than by
    the engine's ``__init__``, which would make the engine's sides. One object
    may be shared by many threads, each its own owner.
    """

    read: AliasReadLock
    write: AliasWriteLock

    def __init__(
        self,
        client: LockClient,
        name: str,
        backend: AliasBackend,
        **options: Unpack[LockOptions],
    ) -> None:
        keys = self._build_keys(client.min_replicas, client.key_prefix, name)
        scripts = client.scripts[RWScripts]
        #: The shared side: many owners at once while nobody else writes.
        self.read = AliasReadLock(client, keys, scripts, backend=backend, **options)
        #: The exclusive side: one owner, and no reader but that owner.
        self.write = AliasWriteLock(client, keys, scripts, backend=backend, **options)


class AsyncAliasReadLock(AliasAttached, AsyncReadLock):
    """The read side of an :class:`AsyncAliasReadWriteLock`; see the module."""


class AsyncAliasWriteLock(AliasAttached, AsyncWriteLock):
    """The write side of an :class:`AsyncAliasReadWriteLock`; see the module."""


class AsyncAliasReadWriteLock(AsyncReadWriteLock):
    """The asyncio twin of :class:`AliasReadWriteLock`: each side owned by the current task.

    The engine's :class:`~django_rlock.core.aio.AsyncReadWriteLock`, its sides
    built here, as :class:`AliasReadWriteLock`'s are.
    """

    read: AsyncAliasReadLock
    write: AsyncAliasWriteLock

    def __init__(
        self,
        client: AsyncLockClient,
        name: str,
        backend: AliasBackend,
        **options: Unpack[LockOptions],
    ) -> None:
        keys = self._build_keys(client.engine.min_replicas, client.key_prefix, name)
        scripts = client.scripts[RWScripts]
        #: The shared side: many tasks at once while nobody else writes.
        self.read = AsyncAliasReadLock(client, keys, scripts, backend=backend, **options)
        #: The exclusive side: one task, and no reader but that task.
        self.write = AsyncAliasWriteLock(client, keys, scripts, backend=backend, **options)


class ThreadOwnedReadWriteLock:
    """``async with`` on both sides of a sync read-write lock, each run on the task's thread.

    What a backend with no native asyncio engine (a cache alias, Sentinel...)
    returns from ``async_read_write_lock``: see :mod:`django_rlock.backends._threadowned`.
    One task's calls on either side run on the one thread that task is given,
    so the task is one owner: its write may read, its read may not write.
    """

    def __init__(self, lock: AliasReadWriteLock) -> None:
        #: The shared side, for ``async with``.
        self.read = ThreadOwnedLock(lock.read)
        #: The exclusive side, for ``async with``.
        self.write = ThreadOwnedLock(lock.write)

    @property
    def name(self) -> str:
        """The lock's name."""
        return self.read.name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
