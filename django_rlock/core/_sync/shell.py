"""What every threaded lock shell reads: its client (:class:`Client`), a waiting shell's type."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from redis import Redis

from django_rlock.core._protocol.holds import Hold
from django_rlock.core._protocol.lock import LockEngine, ScriptRegistry, WaitingShell
from django_rlock.core._sync.waiting import Listener


class Client(LockEngine, Protocol):
    """What the threaded shells need of their :class:`~django_rlock.core.LockClient`.

    A lock reads its client through this and nothing else, so a kind never
    depends on the concrete client (which builds every kind).
    """

    redis: Redis
    scripts: ScriptRegistry
    #: Wakes waiters when a lock they wait for is released.
    listener: Listener
    #: Runs the acquire script: plain EVALSHA, or EVAL + WAIT with min_replicas.
    send_acquire: Callable[..., Any]

    def held(self) -> Redis | None:
        """The calling thread's held connection, or None (see ``LockClient.held``)."""
        ...

    def bounded(self, timeout: float) -> Redis | None:
        """A client whose calls give up after ``timeout`` seconds, or None."""
        ...

    def declare_lost(self, hold: Hold, reason: str, *, by_owner: bool = False) -> None:
        """Mark ``hold`` lost (once), stop renewing it, and run its callbacks."""
        ...


class SyncShell(WaitingShell, Protocol):
    """A threaded shell of an acquire plan: its attempts are plain calls."""

    def attempt(self, waiter: bool, sleep: float) -> float | None:
        """One acquire call: None when granted, else the seconds to wait at most."""
        ...
