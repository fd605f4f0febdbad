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
from django_rlock.backends._leadership import AliasLeadership
from django_rlock.core._faces import check_name
from django_rlock.core.defaults import DEFAULT_LOCK_ALIAS


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
