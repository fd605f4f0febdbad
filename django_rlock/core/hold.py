"""The local record of one owner's hold on one lock.

Redis is the source of truth for who holds a lock; a :class:`Hold` is what this
process knows about its own hold: the hold count, the fencing token, how long
the key is known to live, and whether the hold was lost. Holds live in the
client, keyed by ``(lock key, owner)``, so that every lock object naming the
same lock in one thread shares them (as Redis does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from django_rlock.core.lock import LockBase

__all__ = ["Hold"]


@dataclass(eq=False)
class Hold:
    """One owner's hold on one lock, as this process knows it.

    ``deadline`` is monotonic: the moment the key may have expired, counted from
    when the last successful acquire or renewal was *sent* (so it is never later
    than the server's own expiry). ``releasing`` is set while the owner's final
    release is on the wire, so a renewal racing it does not call it lost.
    """

    name: str
    key: str
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
