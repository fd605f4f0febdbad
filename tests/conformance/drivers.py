"""One driver interface over every engine and backend, so each rule is written once.

A rule talks to a :class:`Driver` (how to make a lock, who may own it, how to
reach its server) and to :class:`Owner` objects: each owner is one lock owner
of the engine under test (a thread for the sync engines, an asyncio task for
the asyncio ones), and runs lock operations by name, returning plain values.
``owner.call(lock, "acquire", timeout=1)`` is ``lock.acquire(timeout=1)`` on the
owner's thread, or ``await lock.acquire(timeout=1)`` inside the owner's task:
the rule never knows which, so a behaviour that differs between engines fails.

Operations are the contract's names: ``acquire``, ``release``, ``locked``,
``owned``, ``hold_count``, ``ttl``, ``force_release``, ``on_lost``, the
properties ``token`` and ``lost``, and ``enter`` / ``exit`` for ``with`` (or
``async with``).
"""

from __future__ import annotations

import asyncio
import inspect
import io
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import redis

from django_rlock.core._protocol.names import LockKeys

__all__ = ["HANG", "Driver", "Engine", "LoopThread", "Owner", "Pending"]

HANG = 15.0  # seconds: only ever reached when something hangs

#: Operations that read a property instead of calling a method.
PROPERTIES = frozenset({"token", "lost"})
#: What every engine supports: ``with`` / ``async with``.
WITH_ONLY = frozenset({"enter", "exit"})


@dataclass(frozen=True)
class Engine:
    """One engine or backend under the contract, and what applies to it.

    ``server``: its locks live on a redis-server the test can reach (to kill
    connections, delete keys, set ACL users). ``full_api``: its lock objects
    have the whole RLock API; Django's ``async with rlock()`` on a backend
    without a native asyncio lock yields an adapter that only enters and
    exits. (Every engine has both today.) ``is_async``: owners are asyncio tasks (cancellation
    applies).
    """

    id: str
    is_async: bool
    server: bool
    full_api: bool = True
    django: bool = False


class Pending:
    """An operation started in the background (a waiter); its result comes later."""

    def __init__(self, future: Future[Any], cancel: Callable[[], None]) -> None:
        self.future = future
        self._cancel = cancel

    def result(self, timeout: float = HANG) -> Any:
        """The operation's result (its exception raised), waiting at most ``timeout``."""
        return self.future.result(timeout)

    def done(self) -> bool:
        """Whether the operation has ended."""
        return self.future.done()

    def cancel(self) -> None:
        """Cancel the waiting owner (asyncio owners only: a thread cannot be cancelled)."""
        self._cancel()


class Owner:
    """One lock owner of the engine under test, running operations one at a time."""

    def call(self, lock: Any, op: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``op`` on ``lock`` as this owner and return its result (or raise its error)."""
        return self.start(lock, op, *args, **kwargs).result()

    def start(self, lock: Any, op: str, *args: Any, **kwargs: Any) -> Pending:
        """Start ``op`` on ``lock`` as this owner without waiting for it."""
        raise NotImplementedError

    def close(self) -> None:
        """End this owner (its thread or task); what it holds stays held."""


def _target(lock: Any, op: str) -> Any:
    """The object an operation runs on: Django's async handle splits its two faces."""
    if isinstance(lock, AsyncHandle):
        if op in WITH_ONLY:
            return lock.entry
        if lock.twin is None:
            raise TypeError(f"{op!r} is not available on this backend's async lock")
        return lock.twin
    return lock


def apply_sync(lock: Any, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``op`` on a sync lock."""
    if op == "enter":
        return lock.__enter__()
    if op == "exit":
        return lock.__exit__(None, None, None)
    attribute = getattr(lock, op)
    return attribute if op in PROPERTIES else attribute(*args, **kwargs)


async def apply_async(lock: Any, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``op`` on an asyncio lock, awaited where it is a coroutine."""
    target = _target(lock, op)
    if op == "enter":
        return await target.__aenter__()
    if op == "exit":
        return await target.__aexit__(None, None, None)
    attribute = getattr(target, op)
    if op in PROPERTIES:
        return attribute
    result = attribute(*args, **kwargs)
    return await result if inspect.isawaitable(result) else result


class ThreadOwner(Owner):
    """A sync owner: one thread of its own, alive until the driver closes."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="owner")

    def start(self, lock: Any, op: str, *args: Any, **kwargs: Any) -> Pending:
        def cannot_cancel() -> None:
            raise TypeError("a thread owner cannot be cancelled")

        return Pending(self._executor.submit(apply_sync, lock, op, args, kwargs), cannot_cancel)

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)


class LoopThread:
    """An asyncio event loop running on a thread of its own, for the asyncio engines."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="loop", daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, Any], timeout: float = HANG) -> Any:
        """Run ``coroutine`` on the loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        """Stop the loop, then end it as ``asyncio.run`` does: cancel the rest, let it end."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(HANG)
        rest = asyncio.all_tasks(self.loop)
        for task in rest:
            task.cancel()
        # Then what the cancelled tasks started as they ended (an owner task that
        # ends holding a lock has its hold given back by a task of the client's):
        # awaited, not cancelled, so that no release is cut short by the close.
        # asyncio.run stops after the first round: there the give-back is cut
        # short and the lock expires by itself, as its warning says.
        for _ in range(5):  # each round is what the round before started
            if not rest:
                break
            self._finish(rest)
            rest = asyncio.all_tasks(self.loop)
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()

    def _finish(self, tasks: set[asyncio.Task[Any]]) -> None:
        # A gathering future, not a task: the Django backend's loop guard
        # waits for the loop's other tasks, as under asyncio.run.
        ending = asyncio.gather(*tasks, return_exceptions=True)
        # Stopped by a timer, not awaited with a timeout: asyncio.wait would
        # be one more task, which the guard would wait for in turn.
        timer = self.loop.call_later(HANG, self.loop.stop)
        try:
            self.loop.run_until_complete(ending)
        except RuntimeError:  # stopped by the timer: name what still runs
            raise AssertionError(
                f"tasks still running {HANG} s after cancelling:\n{_stacks(self.loop)}"
            ) from None
        finally:
            timer.cancel()


def _stacks(loop: asyncio.AbstractEventLoop) -> str:
    # What each unfinished task awaits: a hang at the loop's end names its cause.
    out = io.StringIO()
    for task in asyncio.all_tasks(loop):
        task.print_stack(file=out)
    return out.getvalue()


class TaskOwner(Owner):
    """An asyncio owner: one long-lived task on the driver's loop, serving operations."""

    def __init__(self, loop: LoopThread) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[tuple[Any, str, tuple[Any, ...], dict[str, Any], Future[Any]]]
        self._task: asyncio.Task[None] = loop.run(self._begin())

    async def _begin(self) -> asyncio.Task[None]:
        self._queue = asyncio.Queue()
        return asyncio.get_running_loop().create_task(self._serve())

    async def _serve(self) -> None:
        current: Future[Any] | None = None
        try:
            while True:
                lock, op, args, kwargs, current = await self._queue.get()
                try:
                    result = await apply_async(lock, op, args, kwargs)
                except Exception as error:  # noqa: BLE001 -- handed to the caller
                    current.set_exception(error)
                else:
                    current.set_result(result)
                current = None
        except asyncio.CancelledError:
            if current is not None:
                current.cancel()
            raise

    def start(self, lock: Any, op: str, *args: Any, **kwargs: Any) -> Pending:
        future: Future[Any] = Future()
        item = (lock, op, args, kwargs, future)
        self._loop.loop.call_soon_threadsafe(self._queue.put_nowait, item)

        def cancel() -> None:
            self._loop.loop.call_soon_threadsafe(self._task.cancel)

        return Pending(future, cancel)

    def close(self) -> None:
        self._loop.loop.call_soon_threadsafe(self._task.cancel)


@dataclass
class AsyncHandle:
    """A Django lock for ``async with rlock(...)``.

    ``entry`` is what ``rlock()`` returns (entered with ``async with``), and
    ``twin`` the object ``async with`` yields, for the rest of the API (None
    when the backend's yields only enter and exit).
    """

    entry: Any
    twin: Any
    keys: LockKeys


@dataclass
class Driver:
    """What a rule needs of an engine: locks, owners, and the server behind them.

    ``admin`` is a plain client of the lock server (None without one);
    ``new_lock(name, **defaults)`` makes a lock (its keywords are the
    defaults of ``with``); ``new_owner()`` a fresh owner.
    """

    engine: Engine
    watchdog_timeout: float
    admin: redis.Redis | None
    new_lock: Callable[..., Any]
    new_owner: Callable[[], Owner]
    closers: list[Callable[[], None]]

    def lock(self, name: str, **defaults: Any) -> Any:
        """A lock called ``name`` of this engine."""
        return self.new_lock(name, **defaults)

    def owner(self) -> Owner:
        """A new owner (a thread or a task), closed with the driver."""
        owner = self.new_owner()
        self.closers.append(owner.close)
        return owner

    def owners(self, count: int) -> list[Owner]:
        """``count`` new owners."""
        return [self.owner() for _ in range(count)]

    @staticmethod
    def keys(lock: Any) -> LockKeys:
        """The Redis keys of ``lock``."""
        keys: LockKeys = lock.keys
        return keys

    def close(self) -> None:
        """Close owners, clients and loops, newest first."""
        while self.closers:
            self.closers.pop()()
