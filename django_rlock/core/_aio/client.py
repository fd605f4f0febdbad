"""AsyncLockClient: the asyncio entry point, twin of :class:`~django_rlock.core.LockClient`.

Use one client per event loop (as with ``redis.asyncio`` clients). Holds are
recorded in the same registry as the sync engine's, and renewed by the same
one-per-process watchdog thread over a sync connection of the client's own, so
renewal never runs on, or blocks, the event loop.

Acquire and release go over the client's lean connection (:mod:`~django_rlock.core._aio.wire`);
everything else through the ``redis.asyncio`` client. A call whose caller is
cancelled while it is on its way is finished in a task of the client's
(:meth:`AsyncLockClient.finish_for`), and the same owner's next call waits for
that task: an owner's calls reach Redis one after the other, in the order it
made them, as a thread's do.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, Unpack

import redis.asyncio
from redis.commands.core import AsyncScript
from redis.exceptions import ResponseError

from django_rlock.core._aio.connection import connect_async, sync_twin
from django_rlock.core._aio.fairlock import AsyncFairLock
from django_rlock.core._aio.leader import AsyncLeadership
from django_rlock.core._aio.locks import AsyncRLock
from django_rlock.core._aio.ratelimiter import AsyncRateLimiter
from django_rlock.core._aio.redisson import AsyncRedissonRLock
from django_rlock.core._aio.rwlock import AsyncReadWriteLock
from django_rlock.core._aio.semaphore import AsyncSemaphore
from django_rlock.core._aio.waiting import AsyncReleaseListener
from django_rlock.core._aio.wire import Flight, Wire
from django_rlock.core._protocol.calls import ScriptCall
from django_rlock.core._protocol.layouts import REDISSON, RLOCK
from django_rlock.core._protocol.lock import LockOptions, ScriptRegistry
from django_rlock.core._protocol.names import check_name
from django_rlock.core._protocol.refusals import OomSafeBase, raise_if_refused
from django_rlock.core._protocol.rwlock import RWScripts
from django_rlock.core._protocol.urls import redact_url
from django_rlock.core._sync.client import LockClient
from django_rlock.core.defaults import (
    DEFAULT_DEADLOCK_TIMEOUT,
    DEFAULT_KEY_PREFIX,
    DEFAULT_WATCHDOG_TIMEOUT,
)

T = TypeVar("T")


class AsyncLockClient:
    """Makes :class:`AsyncRLock` locks on one Redis server; see :class:`LockClient`.

    ``connection`` is a redis URL or a ``redis.asyncio.Redis``; a client built
    from a URL is closed by :meth:`aclose`. ``server`` is how errors name the
    server (default: the URL without its credentials, or host and port).
    ``layout`` as for :class:`LockClient` (``"redisson"``: :meth:`lock` is shared
    with Redisson's RLock); ``sharded_subscription`` may be ``"auto"`` or
    ``"off"``: this client listens with SUBSCRIBE only, which is what Redisson
    does on one server (SPUBLISH is for a cluster, which this client does not serve).
    ``deadlock_timeout`` as for :class:`LockClient`: sync and asyncio waiters of
    one deployment are one wait-for graph. ``lock_order_check`` as for
    :class:`LockClient`: sync and asyncio owners of a process share one graph of orders.
    """

    def __init__(
        self,
        connection: str | redis.asyncio.Redis,
        *,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        watchdog_timeout: float = DEFAULT_WATCHDOG_TIMEOUT,
        server: str | None = None,
        layout: str = RLOCK,
        sharded_subscription: str = "auto",
        deadlock_timeout: float | None = DEFAULT_DEADLOCK_TIMEOUT,
        lock_order_check: bool = False,
    ) -> None:
        if sharded_subscription == "on":
            raise NotImplementedError(
                "AsyncLockClient(sharded_subscription='on') is not offered: the asyncio "
                "listener subscribes with SUBSCRIBE only; use 'auto' or 'off' (as Redisson "
                "on one server), or the threaded LockClient for SPUBLISH"
            )
        self.redis, self._owns_redis = connect_async(connection)
        #: The sync engine: its registry records the holds, its watchdog renews them.
        self.engine = LockClient(
            sync_twin(self.redis),
            key_prefix=key_prefix,
            watchdog_timeout=watchdog_timeout,
            server=server or (redact_url(connection) if isinstance(connection, str) else None),
            layout=layout,
            sharded_subscription=sharded_subscription,
            deadlock_timeout=deadlock_timeout,
            lock_order_check=lock_order_check,
        )
        self.layout = self.engine.layout
        #: How errors name the server: never with its credentials.
        self.server = self.engine.server
        self.key_prefix = self.engine.key_prefix
        self.watchdog_timeout = self.engine.watchdog_timeout
        #: Every kind's scripts on the asyncio connection, made on first use.
        self.scripts = ScriptRegistry(
            functools.partial(_AsyncLockScript, self.redis),
            functools.partial(_AsyncOomSafeScript, self.redis),
        )
        #: Wakes waiters when a lock they wait for is released.
        self.listener = AsyncReleaseListener(self.redis)
        self._tasks: set[asyncio.Task[Any]] = set()
        #: Owner id -> the task doing what its last call left to do (see finish_for).
        self.unfinished: dict[str, asyncio.Task[Any]] = {}
        self._wire = Wire(self.redis, self.spawn)

    def __repr__(self) -> str:
        return (
            f"<AsyncLockClient prefix={self.key_prefix!r} watchdog_timeout={self.watchdog_timeout}>"
        )

    def lock(self, name: str, **options: Unpack[LockOptions]) -> AsyncRLock:
        """A reentrant async lock called ``name``; the keywords are ``async with``'s defaults.

        ``timeout``, ``lease`` and ``blocking``, as for :meth:`LockClient.lock`;
        with ``layout="redisson"``, shared with Redisson's RLock of that name.
        """
        kind = AsyncRedissonRLock if self.layout == REDISSON else AsyncRLock
        return kind(self, check_name(name), **options)

    def fair_lock(self, name: str, **options: Unpack[LockOptions]) -> AsyncFairLock:
        """A reentrant async lock called ``name`` granted in arrival order.

        The keywords are ``async with``'s defaults, as for :meth:`lock`; see
        :class:`~django_rlock.core.aio.fairlock.AsyncFairLock`.
        """
        return AsyncFairLock(self, check_name(name), **options)

    def semaphore(self, name: str, permits: int, **options: Unpack[LockOptions]) -> AsyncSemaphore:
        """An async semaphore of ``permits`` permits; see :meth:`LockClient.semaphore`."""
        return AsyncSemaphore(self, check_name(name), permits, **options)

    def leader(self, name: str, *, timeout: float | None = None) -> AsyncLeadership:
        """Leader election ``name`` for asyncio: ``async with client.leader(name) as term:``.

        The twin of :meth:`LockClient.leader`: the current task is the
        candidate, and the leader while the block runs.
        """
        return AsyncLeadership(name, lambda: self.lock(name), timeout=timeout)

    def rate_limiter(self, name: str, rate: str, *, burst: int | None = None) -> AsyncRateLimiter:
        """A global rate limit called ``name`` for asyncio; see :meth:`LockClient.rate_limiter`."""
        return AsyncRateLimiter(self, check_name(name), rate, burst=burst)

    async def __aenter__(self) -> AsyncLockClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def on_lost(self, callback: Callable[[Any], object]) -> None:
        """Call ``callback(lock)`` (on a thread of its own) when any hold of this client is lost."""
        self.engine.on_lost(callback)

    async def settle(self) -> None:
        """Wait until the background work of cancelled calls has finished."""
        # Only the unfinished: a finished task leaves the set by a done callback,
        # and since Python 3.12 gathering only finished tasks completes without
        # yielding to the loop, so that callback would never run (a busy loop).
        while pending := [task for task in self._tasks if not task.done()]:
            await asyncio.gather(*pending, return_exceptions=True)
        await self.listener.settle()

    async def aclose(self) -> None:
        """Finish background work, stop listening and close what this client opened.

        Locks still held are not released: they expire as if the process died.
        """
        await self.settle()
        self._wire.close()
        await self.listener.aclose()
        self.engine.close()
        # Both pools were built here; a client given a pool leaves it open on close.
        self.engine.redis.connection_pool.disconnect()
        if self._owns_redis:
            await self.redis.aclose(close_connection_pool=True)

    def spawn(self, coroutine: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run work that must finish even if its caller is cancelled."""
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(_forget_task(self._tasks))
        return task

    def send(self, script: Any, call: ScriptCall, packed: bytes | None = None) -> Flight:
        """Send an acquire or release ``call`` of ``script`` now, with no await (see wire.py).

        ``packed``: the same call already packed with ``script.sha``, if the lock kept it.
        """
        return self._wire.send(script, call, packed)

    def finish_for(self, owner: str, coroutine: Coroutine[Any, Any, object]) -> None:
        """Run what ``owner``'s call leaves to do in a task; its next call waits for it.

        The end of a call whose caller was cancelled on its way (a grant to
        give back, a release to settle), or the ABANDON of a waiter that gave
        up: so the owner's calls reach Redis in the order it made them, and
        none of them can come after the owner's next call and undo it.
        """
        self.unfinished[owner] = self.spawn(
            self._finish(owner, self.unfinished.get(owner), coroutine)
        )

    async def _finish(
        self,
        owner: str,
        previous: asyncio.Task[Any] | None,
        coroutine: Coroutine[Any, Any, object],
    ) -> None:
        try:
            if previous is not None:
                await asyncio.wait([previous])
            await coroutine
        finally:
            coroutine.close()  # if it never ran
            # Gone as it ends (not by a done callback, a loop iteration later).
            if self.unfinished.get(owner) is asyncio.current_task():
                del self.unfinished[owner]

    async def finished(self, owner: str) -> None:
        """Wait until no call of ``owner``'s is being finished (see :meth:`finish_for`).

        Not for the finishing work itself: each waits for the one before it,
        and one made later would wait for it in turn.
        """
        while (task := self.unfinished.get(owner)) is not None:
            # Not cancelled with its waiter: that work must finish.
            await asyncio.wait([task])

    def read_write_lock(self, name: str, **options: Unpack[LockOptions]) -> AsyncReadWriteLock:
        """Many readers or one writer, called ``name``: ``.read`` and ``.write``.

        The asyncio twin of :meth:`LockClient.read_write_lock`; the keywords
        are both sides' defaults for ``async with``.
        """
        return AsyncReadWriteLock(self, check_name(name), self.scripts[RWScripts], **options)


def _forget_task(tasks: set[asyncio.Task[Any]]) -> Callable[[asyncio.Task[Any]], None]:
    def done(task: asyncio.Task[Any]) -> None:
        tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: its caller may have been cancelled away

    return done


class _AsyncLockScript(AsyncScript):
    """The asyncio :class:`~django_rlock.core._sync.scripts.LockScript`."""

    async def __call__(  # type: ignore[override]  # narrower than redis-py's: only lists are passed
        self, keys: list[Any] | None = None, args: list[Any] | None = None, client: Any = None
    ) -> Any:
        try:
            return await super().__call__(keys=keys or [], args=args or [], client=client)
        except ResponseError as error:
            raise_if_refused(error)
            raise


class _AsyncOomSafeScript(OomSafeBase):
    """The asyncio :class:`~django_rlock.core._sync.scripts.OomSafeScript` (same policy object)."""

    def __init__(self, client: redis.asyncio.Redis, body: str) -> None:
        super().__init__(lambda text: _AsyncLockScript(client, text), body)

    @property
    def sha(self) -> str:
        """The SHA1 of the variant in use (what the lean path sends)."""
        sha: str = self._choose()[1].sha
        return sha

    async def __call__(self, keys: list[Any], args: list[Any]) -> Any:
        flagged, script = self._choose()
        try:
            return await script(keys=keys, args=args)
        except ResponseError as error:
            return await self._after(flagged, error)(keys=keys, args=args)
