"""Holds this process declared lost, or gave up, that the server may still count.

A hold is declared lost on its local deadline, or when its client is closed,
while its key may live on in Redis (a stall, a lost reply, a client closed by
``override_settings``). A hold is given up while the server may still count it
after a release whose outcome is unknown, or when a release finds the server
counting more holds than the client (a re-entry whose reply never came); see
``HoldRegistry._left_on_server``. Owner ids belong to the process and thread (or task),
not to a client, so the owner's next acquire of that lock, through any client
of the process, must not re-enter that old grant: it sends what is recorded
here, and the acquire script takes those holds off first (only while the
lock's token is still theirs), so the owner gets a new grant with a new token.
"""

from __future__ import annotations

import threading

from django_rlock.core._process import forking


class _LostHolds:
    """(lock key, owner) -> (token, holds) declared lost since the owner's last grant."""

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.lost: dict[tuple[str, str], tuple[int, int]] = {}

    def reset(self) -> None:
        """A new mutex, nothing recorded (a forked child's owners are new)."""
        self.mutex = threading.Lock()
        self.lost = {}


_table = _LostHolds()


def record(key: str, owner: str, token: int, holds: int) -> None:
    """Note ``holds`` holds of ``owner`` on ``key`` (granted with ``token``) declared lost."""
    with _table.mutex:
        known_token, known = _table.lost.get((key, owner), (token, 0))
        _table.lost[(key, owner)] = (token, holds + (known if known_token == token else 0))


def lost_on_server(key: str, owner: str) -> tuple[int, int] | None:
    """(token, holds) the owner's next acquire of ``key`` takes off, or None."""
    if not _table.lost:
        return None  # almost always: nothing lost, no mutex
    with _table.mutex:
        return _table.lost.get((key, owner))


def forget(key: str, owner: str) -> None:
    """The owner was granted ``key`` again: whatever was lost is off the server."""
    if not _table.lost:
        return
    with _table.mutex:
        _table.lost.pop((key, owner), None)


@forking.after_fork_in_child
def _after_fork_in_child() -> None:
    _table.reset()
