"""``leader()``: leader election on a configured alias, sync and asyncio.

::

    from django_rlock import leader

    with leader("nightly-billing") as term:          # waits until elected
        while not term.lost:
            bill_next_customer(fence=term.token)

    async with leader("feed-poller") as term:        # in async code: the task leads
        ...

It is :meth:`LockClient.leader <django_rlock.core.LockClient.leader>` on
``locks[using]``: the election is the lock called ``name`` of that alias, so
its grants and losses send the lock signals and metrics, and ``manage.py
rlock list`` and the admin show its leader (``MainThread (leader)``). The
whole story (terms, fencing, stepping down) is in :mod:`django_rlock.core._sync.leader`.
"""

from __future__ import annotations

from django_rlock._handler import locks
from django_rlock.backends.base import BaseLockBackend
from django_rlock.core import Leadership, RLock
from django_rlock.core._faces import check_name
from django_rlock.core.aio import AsyncLeadership, AsyncRLock
from django_rlock.core.defaults import DEFAULT_LOCK_ALIAS


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


def leader(
    name: str, *, using: str = DEFAULT_LOCK_ALIAS, timeout: float | None = None
) -> AliasLeadership:
    """The leader election ``name`` on alias ``using``: ``with`` it to lead, one at a time.

    The block (``with`` or ``async with``) waits until this thread or task is
    elected, at most ``timeout`` seconds (None: as long as it takes; then
    :class:`~django_rlock.exceptions.LockTimeout`), and runs as the only
    leader. ``term.token`` is the fencing token of the term, ``term.lost``
    turns true (and ``term.on_lost`` callbacks run) when the term is lost:
    the block should then step down by leaving. See :mod:`django_rlock.core._sync.leader`.
    """
    return AliasLeadership(check_name(name), locks[using], timeout)
