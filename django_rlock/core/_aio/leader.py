"""AsyncLeadership: leader election for asyncio code, twin of :mod:`django_rlock.core._sync.leader`.

::

    client = AsyncLockClient("redis://127.0.0.1:6379/0")

    async with client.leader("billing-daemon") as term:     # waits until elected
        while not term.lost:
            await run_one_batch(fence=term.token)

The task that enters the block is the leader (it must run the block for the
whole term); everything else is as for the sync election: the same lock, the
same :class:`~django_rlock.core._protocol.leader.Term`, so sync and asyncio candidates
of one name take part in one election. ``term.on_lost`` callbacks run on the
leader's event loop; a coroutine function runs as a task.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import TYPE_CHECKING, Any

from django_rlock.core._process.holder import holder_details
from django_rlock.core._protocol.leader import LEADER_ROLE, Term, TermCallback, not_elected
from django_rlock.core._protocol.names import check_name, check_timeout
from django_rlock.core.exceptions import LockLostError

if TYPE_CHECKING:
    from django_rlock.core._aio.locks import AsyncRLock


class AsyncLeadership:
    """``async with client.leader(name) as term:``, as the sync ``Leadership`` is ``with``.

    Made by :meth:`AsyncLockClient.leader` (and ``django_rlock.leader`` in
    async code). One object may be entered by several tasks, each its own
    candidate.
    """

    def __init__(
        self, name: str, make_lock: Callable[[], AsyncRLock], *, timeout: float | None = None
    ) -> None:
        self.name = check_name(name)
        self.timeout = check_timeout(timeout)
        self._make_async_lock = make_lock
        # Per task, the terms it entered through this object, newest last.
        self._task_terms: weakref.WeakKeyDictionary[
            asyncio.Task[Any], list[tuple[AsyncRLock, Term]]
        ] = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return f"<AsyncLeadership {self.name!r}>"

    async def __aenter__(self) -> Term:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("async with on a leader election must run inside an asyncio task")
        lock = self._make_async_lock()
        with holder_details(role=LEADER_ROLE):
            elected = await lock.acquire(timeout=self.timeout)
        if not elected:
            raise not_elected(self.name, self.timeout)
        # The hold was granted to this task just now: it has a token.
        token = lock.token
        assert token is not None
        term = Term(
            self.name, token, lost_here=lambda: _current_task() is task and lock.lost, run=_run
        )
        lock.on_lost(lambda _lock: term.lose())  # runs on this loop
        if lock.lost:  # lost before its callback was there to tell the term
            term.lose()
        self._task_terms.setdefault(task, []).append((lock, term))
        return term

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        task = asyncio.current_task()
        stack = self._task_terms[task] if task is not None else []
        lock, term = stack.pop()
        if not stack and task is not None:
            del self._task_terms[task]
        term.end()
        try:
            await lock.release()
        except LockLostError:
            term.lose()  # stepping down from a lost term raises nothing (see Leadership)


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # read from a thread with no running event loop
        return None


def _run(callback: TermCallback, term: Term) -> None:
    result = callback(term)
    if isinstance(result, Coroutine):
        asyncio.ensure_future(result)  # noqa: RUF006 -- the loop keeps it until it ends
