"""The leader election a backend's alias runs: the engine's, on the alias's locks.

:class:`AliasLeadership` is :class:`~django_rlock.core.Leadership` and
:class:`~django_rlock.core.aio.AsyncLeadership` in one, electing on
``backend.lock(name)`` (or its asyncio twin), so its grants and losses send
the lock signals and metrics. :func:`django_rlock.leader` (in
:mod:`django_rlock._web.leader`) hands it out.
"""

from __future__ import annotations

from django_rlock.backends.base import BaseLockBackend
from django_rlock.core import Leadership, RLock
from django_rlock.core.aio import AsyncLeadership, AsyncRLock


class AliasLeadership(Leadership, AsyncLeadership):
    """A leader election of one ``RLOCKS`` alias, for ``with`` and ``async with``."""

    def __init__(self, name: str, backend: BaseLockBackend, timeout: float | None) -> None:
        self.backend = backend
        Leadership.__init__(self, name, self._election_lock, timeout=timeout)
        AsyncLeadership.__init__(self, name, self._async_election_lock, timeout=timeout)

    def __repr__(self) -> str:
        return f"<AliasLeadership {self.name!r} using={self.backend.alias!r}>"

    def _election_lock(self) -> RLock:
        lock = self.backend.lock(self.name)
        # The alias's MAX_HOLD bounds work, not office: a term lasts as long as its leader.
        lock.max_hold = None
        return lock

    def _async_election_lock(self) -> AsyncRLock:
        lock = self.backend.async_lock(self.name)
        if not isinstance(lock, AsyncRLock):
            raise NotImplementedError(
                "async with leader() needs the asyncio engine, which "
                f"RLOCKS[{self.backend.alias!r}] lacks (a cache alias, Sentinel, Cluster or "
                "MIN_REPLICAS): use a sync `with leader(...)` on a thread that lives for "
                "the whole term"
            )
        lock.max_hold = None  # as for the sync election
        return lock
