"""AsyncFairLock: the asyncio twin of :class:`django_rlock.core._sync.fairlock.FairLock`.

Same scripts, keys and queue: sync and async callers of one fair lock name
wait in one queue, in arrival order. The owner is the current task::

    client = AsyncLockClient("redis://127.0.0.1:6379/0")
    async with client.fair_lock("report:42") as lock:
        await build(report, fence=lock.token)

A cancelled ``acquire`` leaves the queue (and gives back a grant that arrived
as it was cancelled, a handed one too: FAIR_ABANDON finds it by its mark), as
:class:`~django_rlock.core._aio.locks.AsyncRLock` does.
"""

from __future__ import annotations

import asyncio
from typing import Self, Unpack

from django_rlock.core._aio.locks import (
    AsyncHandOverSubscription,
    AsyncRLock,
    AsyncWaitingShellBase,
)
from django_rlock.core._aio.shell import AsyncShell, Client
from django_rlock.core._aio.waiting import AsyncSubscription
from django_rlock.core._protocol import clock
from django_rlock.core._protocol.deadlocks import Detector
from django_rlock.core._protocol.fairlock import FairBase, FairScripts, sleep_cap
from django_rlock.core._protocol.lock import KindScripts, LockOptions, LockScripts
from django_rlock.core._protocol.plan import AcquirePlan


class AsyncFairLock(FairBase, AsyncRLock):
    """An asyncio lock granted in arrival order; see :meth:`AsyncLockClient.fair_lock`."""

    def __init__(self, client: Client, name: str, **options: Unpack[LockOptions]) -> None:
        super().__init__(client, name, **options)
        self._fair_setup()

    def __repr__(self) -> str:
        return f"<AsyncFairLock {self.name!r}>"

    async def __aenter__(self) -> Self:
        return await super().__aenter__()

    def _waiting_shell(self, owner: str, lease: float | None, plan: AcquirePlan) -> AsyncShell:
        # The caller queues: every attempt of a blocking call carries its queue id.
        queue_id = self._queue_id(plan, self.client.listener.new_waiter_id)
        return _AsyncFairWaiting(self, owner, lease, plan, queue_id)

    async def _queued_attempt(
        self, owner: str, lease: float | None, queue_id: str, sleep: float, started: float
    ) -> float | None:
        """One fair acquire call (shielded, as AsyncRLock's): None when granted, else seconds."""
        return await self._attempt(owner, lease, queue_id, sleep, started)

    def _kind_scripts(self) -> KindScripts:
        return self._fair_row(self.client.scripts[FairScripts], self.client.scripts[LockScripts])

    def _handed(self, waiting: _AsyncFairWaiting, subscription: AsyncSubscription) -> bool:
        """Take the grant a handoff message brought, if any (see ``FairBase._take_handoff``)."""
        if not self._take_handoff(waiting, subscription):
            return False
        task = asyncio.current_task()
        if task is not None:
            self._lost_tasks.pop(task, None)
        return True

    def _leave_queue(self, queue_id: str, *, abandon: bool, owner: str) -> None:
        """As ``FairLock._leave_queue``, with no await: a cancelled acquire still leaves.

        The abandon is sent after ``owner``'s cancelled attempt, if any (see
        :meth:`AsyncLockClient.finish_for`): one that overtook it would leave
        the queue entry that attempt then makes, a dead head for its lifetime.
        """
        self._end_waiting(queue_id)
        if abandon:
            self.client.finish_for(owner, self._abandon(queue_id))


class _AsyncFairWaiting(AsyncWaitingShellBase):
    """The asyncio shell of an :class:`AcquirePlan` for a fair lock (see ``_FairWaiting``)."""

    lock: AsyncFairLock

    def __init__(
        self,
        lock: AsyncFairLock,
        owner: str,
        lease: float | None,
        plan: AcquirePlan,
        queue_id: str,
    ) -> None:
        self.lock, self.owner, self.lease, self.plan = lock, owner, lease, plan
        self.started = plan.started
        self.queue_id = queue_id
        self.subscription: AsyncHandOverSubscription | None = None
        #: An attempt that may have queued the caller was sent, and no grant came back.
        self.queued = False
        #: When the last attempt was sent (at the latest): see ``_FairWaiting``.
        self.sent_at = plan.started
        # Made by the first deadlock check (most calls never wait that long).
        self.detector: Detector | None = None

    async def attempt(self, waiter: bool, sleep: float) -> float | None:
        self.queued = self.queued or bool(self.queue_id)
        self.sent_at = clock.monotonic()
        wait = await self.lock._queued_attempt(
            self.owner, self.lease, self.queue_id, sleep_cap(self.plan), self.plan.started
        )
        if wait is None:
            self.queued = False
        return wait

    def listen(self) -> None:
        subscription = self.lock.client.listener.subscribe(self.lock.keys.channel, self.queue_id)
        self.subscription = AsyncHandOverSubscription(self, subscription)

    def handed(self, subscription: AsyncSubscription) -> bool:
        return self.lock._handed(self, subscription)

    def close(self, *, registered: bool) -> None:
        if self.subscription is not None:
            self.lock.client.listener.unsubscribe(self.subscription.inner)
        self.forget_edge()
        abandon = self.queued or (registered and bool(self.queue_id))
        self.lock._leave_queue(self.queue_id, abandon=abandon, owner=self.owner)
