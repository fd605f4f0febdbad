"""What every asyncio lock shell reads: its client (:class:`Client`), and a waiting shell's type."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine
from typing import Any, Protocol, TypeVar

from redis.asyncio import Redis

from django_rlock.core._aio.waiting import AsyncReleaseListener
from django_rlock.core._aio.wire import Flight
from django_rlock.core._protocol.calls import ScriptCall
from django_rlock.core._protocol.lock import LockEngine, ScriptRegistry, WaitingShell

T = TypeVar("T")


class Client(Protocol):
    """What the asyncio shells need of their :class:`~django_rlock.core.aio.AsyncLockClient`.

    A lock reads its client through this and nothing else, so a kind never
    depends on the concrete client (which builds every kind).
    """

    key_prefix: str
    redis: Redis
    scripts: ScriptRegistry
    #: Wakes waiters when a lock they wait for is released.
    listener: AsyncReleaseListener

    @property
    def engine(self) -> LockEngine:
        """The sync engine whose hold registry and watchdog keep these locks' holds."""
        ...

    #: Owner id -> the task doing what that owner's last call left to do.
    unfinished: dict[str, asyncio.Task[Any]]

    def spawn(self, coroutine: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``coroutine`` as a task the client keeps until it is done."""
        ...

    def send(self, script: Any, call: ScriptCall, packed: bytes | None = None) -> Flight:
        """Send an acquire or release ``call`` now, with no await (see ``_aio/wire.py``)."""
        ...

    def finish_for(self, owner: str, coroutine: Coroutine[Any, Any, object]) -> None:
        """Run what ``owner``'s call leaves to do in a task; its next call waits for it."""
        ...

    async def finished(self, owner: str) -> None:
        """Wait until no call of ``owner``'s is being finished."""
        ...


class AsyncShell(WaitingShell, Protocol):
    """An asyncio shell of an acquire plan: its attempts are awaited."""

    def attempt(self, waiter: bool, sleep: float) -> Awaitable[float | None]:
        """One acquire call: None when granted, else the seconds to wait at most."""
        ...
