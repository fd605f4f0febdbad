"""The local record of one owner's hold on one lock.

Redis is the source of truth for who holds a lock; a :class:`Hold` is what this
process knows about its own hold: the hold count, the fencing token, how long
the key is known to live, and whether the hold was lost. Holds live in the
client, keyed by ``(lock key, owner)``, so that every lock object naming the
same lock in one thread shares them (as Redis does).

One rule ties a hold's local deadline to its key's expiry, on every path that
sets or extends it (a grant, a re-entry, a renewal, a retry the request latch
reports): each such script replies with the key's PTTL after the call, and the
deadline is the call's *send* time plus that PTTL (:func:`key_deadline`). The
server ran the call after it was sent, so the deadline never falls after the
key's real expiry, whichever branch the script took and however late the
reply came. No script shortens a held key's life (but MultiLock's re-expiry of
a grant it has just made, which then sets the deadline anew), so a later reply
can only move a deadline later (:meth:`Hold.extend`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from django_rlock.core.lock import LockBase

__all__ = ["Hold", "key_deadline"]


def key_deadline(sent_at: float, pttl_ms: int) -> float:
    """The local monotonic moment a key may expire, from a reply about it.

    ``sent_at`` is when the call was sent, ``pttl_ms`` the key's PTTL the
    script reported after running it. A key with no expiry (-1, only ever set
    by hand) never expires by itself.
    """
    if pttl_ms < 0:
        return math.inf
    return sent_at + pttl_ms / 1000


@dataclass(eq=False)
class Hold:
    """One owner's hold on one lock, as this process knows it.

    ``deadline`` is monotonic: the moment the key may have expired, counted
    from when the call that last set its expiry was *sent* (so it is never
    later than the server's own expiry; see :func:`key_deadline`).
    ``releasing`` is set while the owner's final release is on the wire, so a
    renewal racing it does not call it lost.
    """

    name: str
    key: str
    #: The lock's fencing counter key: renewals give it the lock's expiry.
    fence: str
    owner: str
    token: int
    count: int
    watchdog: bool
    deadline: float
    acquired_at: float
    locks: list[LockBase] = field(default_factory=list)
    lost: bool = False
    releasing: bool = False
    released: bool = False

    def add_lock(self, lock: LockBase) -> None:
        """Remember that ``lock`` took this hold, so its ``on_lost`` callbacks run on loss."""
        if all(existing is not lock for existing in self.locks):
            self.locks.append(lock)

    def extend(self, sent_at: float, pttl_ms: int) -> None:
        """Take in a reply that found the key alive, ``pttl_ms`` left (see :func:`key_deadline`).

        Never moves the deadline earlier: no script shortens a held key, so
        of two replies (a renewal and a re-entry racing it) the later
        deadline is the true one, whichever reply arrived last.
        """
        self.deadline = max(self.deadline, key_deadline(sent_at, pttl_ms))
