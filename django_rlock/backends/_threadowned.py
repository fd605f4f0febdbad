"""An async face for a backend whose locks are owned by threads (cache aliases...).

Backends with a native asyncio lock (Redis, embedded, LocMem) hand out
:class:`~django_rlock.core.aio.AsyncRLock` objects; the others get this
adapter, which runs the sync lock's calls on a worker thread so the event loop
never blocks.

The owner must be the asyncio task, as with a native async lock: a task that
enters ``async with rlock(name)`` twice re-enters, and two tasks exclude each
other. A sync lock's owner is the calling thread, so every call of one task,
through any number of lock objects, runs on the one thread that task is given
while it holds (or waits for) anything; the thread ends with the task's last hold.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Any, Self, TypeVar

from django_rlock.core import RLock
from django_rlock.core._faces import forking

T = TypeVar("T")


class _TaskThread:
    """The thread that runs one asyncio task's sync lock calls, kept while it holds."""

    def __init__(self) -> None:
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlock-async")
        self.entries = 0  # entries waiting or held; the thread ends at zero


# Per asyncio task; weak, so a task that ends leaves nothing behind.
_task_threads: weakref.WeakKeyDictionary[asyncio.Task[Any], _TaskThread] = (
    weakref.WeakKeyDictionary()
)
# Guards _task_threads and the entry counts: counts drop on worker threads too.
_task_threads_lock = threading.Lock()


@forking.after_fork_in_child
def _reset_after_fork() -> None:
    global _task_threads_lock  # noqa: PLW0603 -- a mutex held across fork stays held in the child
    _task_threads_lock = threading.Lock()


def _enter_thread() -> tuple[asyncio.Task[Any], _TaskThread]:
    """The current task's thread, counting one more entry on it."""
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("async with on a lock must run inside an asyncio task")
    with _task_threads_lock:
        thread = _task_threads.get(task)
        if thread is None:
            thread = _task_threads[task] = _TaskThread()
        thread.entries += 1
    return task, thread


def _leave_thread(task: asyncio.Task[Any], thread: _TaskThread) -> None:
    """Count one entry of ``task`` ended; its thread ends with the last."""
    with _task_threads_lock:
        thread.entries -= 1
        if thread.entries > 0:
            return
        if _task_threads.get(task) is thread:
            del _task_threads[task]
    thread.executor.shutdown(wait=False)


class ThreadOwnedLock:
    """``async with`` over a sync lock, run on the current task's own thread."""

    def __init__(self, lock: RLock) -> None:
        self.lock = lock

    @property
    def name(self) -> str:
        """The lock's name."""
        return self.lock.name

    async def __aenter__(self) -> Self:
        task, thread = _enter_thread()
        future = thread.executor.submit(self.lock.__enter__)
        try:
            await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            # The wait goes on in its thread; a hold it ends in is given back.
            future.add_done_callback(lambda done: self._release_if_held(done, task, thread))
            raise
        except BaseException:
            _leave_thread(task, thread)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        task = asyncio.current_task()
        with _task_threads_lock:
            thread = _task_threads.get(task) if task is not None else None
        if task is None or thread is None:
            raise RuntimeError(f"lock {self.name!r} was not entered by this asyncio task")
        release = _then_leave(thread.executor.submit(self.lock.release), task, thread)
        await asyncio.shield(asyncio.wrap_future(release))

    def _release_if_held(
        self, future: Future[Any], task: asyncio.Task[Any], thread: _TaskThread
    ) -> None:
        if not future.cancelled() and future.exception() is None:
            _then_leave(thread.executor.submit(self.lock.release), task, thread)
        else:
            _leave_thread(task, thread)


def _then_leave(future: Future[T], task: asyncio.Task[Any], thread: _TaskThread) -> Future[T]:
    """``future``, after which the entry it ends is counted off ``task``'s thread."""

    def leave(_: Future[T]) -> None:
        _leave_thread(task, thread)

    future.add_done_callback(leave)
    return future
