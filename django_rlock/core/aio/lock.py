"""AsyncRLock: the asyncio twin of :class:`django_rlock.core.RLock`.

Same Lua scripts, same keys, same fencing counter: sync and async owners
exclude each other on the same name. The owner is the current asyncio task,
so tasks on one loop (``asyncio.gather`` children included) are separate
owners, and a task re-enters its own lock::

    client = AsyncLockClient("redis://127.0.0.1:6379/0")
    lock = client.lock("order:42")
    async with lock:
        async with lock:          # re-entry by the same task
            await charge(order, fence=lock.token)

Cancellation is safe at every await: a cancelled ``acquire`` gives back a
grant that arrived as it was cancelled and leaves its waiting registration and
subscription behind it cleaned up; a cancelled ``release`` still completes.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, Unpack

from redis.exceptions import OutOfMemoryError

from django_rlock.core import clock
from django_rlock.core.calls import extend_call, hold_count_reply, ttl_reply
from django_rlock.core.identity import task_owner
from django_rlock.core.lock import (
    LOST_REPLY,
    UNANSWERED,
    KindScripts,
    LockBase,
    LockOptions,
    WaitingShell,
)
from django_rlock.core.plan import AcquirePlan, drive_async

if TYPE_CHECKING:
    from django_rlock.core.aio.client import AsyncLockClient
    from django_rlock.core.aio.waiting import AsyncSubscription
    from django_rlock.core.hold import Hold

__all__ = ["AsyncRLock"]


class AsyncRLock(LockBase):
    """A reentrant distributed lock for asyncio; get one from :meth:`AsyncLockClient.lock`."""

    def __init__(self, client: AsyncLockClient, name: str, **options: Unpack[LockOptions]) -> None:
        super().__init__(client.engine, name, **options)
        self.client = client
        # Tasks whose last hold through this object ended lost (see `lost`).
        self._lost_tasks: weakref.WeakKeyDictionary[asyncio.Task[Any], bool] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:
        return f"<AsyncRLock {self.name!r}>"

    # -- acquiring ----------------------------------------------------------------

    async def acquire(
        self, blocking: bool = True, timeout: float | None = None, lease: float | None = None
    ) -> bool:
        """Take the lock (or one more hold on it); True when held. See :meth:`RLock.acquire`."""
        plan, lease_seconds = self._plan(blocking, timeout, lease)
        with self._reachable("acquire"):
            return await self._acquire_waiting(plan, lease_seconds)

    async def _acquire_waiting(self, plan: AcquirePlan, lease_seconds: float | None) -> bool:
        owner = task_owner()
        shell = self._waiting_shell(owner, lease_seconds, plan)
        try:
            granted = await drive_async(plan, shell)
        finally:
            # No await: a cancelled acquire still leaves nothing behind.
            shell.close(registered=plan.registered)
        if not granted:
            self._gave_up(owner, plan)
        return granted

    async def _attempt(
        self,
        owner: str,
        lease: float | None,
        waiter_id: str = "",
        sleep: float = 0.0,
        requested_at: float | None = None,
    ) -> float | None:
        """One acquire script call, shielded: None when granted, else seconds to wait.

        If the caller is cancelled while the call is in flight, the call still
        completes, and a grant it brings is given back at once.
        """
        call = self.client.spawn(
            self._acquire_script(
                owner, lease, waiter_id, sleep, asyncio.current_task(), requested_at=requested_at
            )
        )
        try:
            return await asyncio.shield(call)
        except asyncio.CancelledError:
            call.add_done_callback(lambda done: self._give_back_if_granted(done, owner))
            raise

    async def _acquire_script(
        self,
        owner: str,
        lease: float | None,
        waiter_id: str,
        sleep: float,
        caller: asyncio.Task[Any] | None,
        *,
        requested_at: float | None = None,
    ) -> float | None:
        call = self._acquire_call(owner, lease, waiter_id, sleep)
        sent_at = clock.monotonic()
        try:
            reply = await _resend_once(
                lambda: self._acquire_sender()(keys=call.keys, args=call.args)
            )
        except (OutOfMemoryError, *UNANSWERED) as error:
            self._acquire_failed(error, owner, call)
        wait = self._acquire_reply(reply, owner, lease, sent_at, requested_at)
        if wait is None and caller is not None:
            self._lost_tasks.pop(caller, None)
        return wait

    def _kind_scripts(self) -> KindScripts:
        return KindScripts.of(self.client.scripts)

    def _waiting_shell(self, owner: str, lease: float | None, plan: AcquirePlan) -> WaitingShell:
        """The shell that runs ``plan``'s calls for ``owner`` (a sibling may queue its own)."""
        return _AsyncWaiting(self, owner, lease, plan.started)

    def _give_back_if_granted(self, call: asyncio.Future[float | None], owner: str) -> None:
        if call.cancelled() or call.exception() is not None or call.result() is not None:
            return
        self.client.spawn(self._release_as(owner))

    async def _abandon(self, waiter_id: str) -> None:
        call = self._abandon_call(waiter_id)
        await self._abandon_sender()(keys=call.keys, args=call.args)

    async def __aenter__(self) -> Self:
        if not await self.acquire(self.blocking, self.timeout, self.lease):
            raise self._timeout_error(await self.ttl())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.release()

    # -- releasing ----------------------------------------------------------------

    async def release(self) -> None:
        """Give back one hold, as :meth:`RLock.release` does.

        Shielded: if the caller is cancelled meanwhile, the release completes
        anyway (and the cancellation still propagates).
        """
        call = self.client.spawn(self._release_as(task_owner(), asyncio.current_task()))
        with self._reachable("release"):
            await asyncio.shield(call)

    async def extend(self, seconds: float) -> None:
        """The task's fixed lease now ends ``seconds`` from now; see :meth:`RLock.extend`."""
        owner = task_owner()
        hold = self._extend_prepare(owner, seconds, "task")
        call = extend_call(*self.hold_keys(owner), owner, seconds)
        sent_at = clock.monotonic()
        with self._reachable("extend"):
            try:
                reply = await self.client.scripts.renew(keys=call.keys, args=call.args)
            except BaseException:  # a cancellation too: the call may have run
                self._extend_failed(hold, sent_at, seconds)
                raise
        self._extend_settle(hold, sent_at, reply)

    def give_back_leaked(self, hold: Hold) -> None:
        """Release every hold of a leaked ``hold``'s owner, on this lock's event loop.

        Called on that loop (as the owner task ends); the releases run in a
        task of the client's, which outlives the ended owner.
        """
        owner, count = hold.owner, hold.count

        async def release_all() -> None:
            for _ in range(count):
                await self._release_as(owner)

        self.client.spawn(release_all())

    async def _release_as(self, owner: str, caller: asyncio.Task[Any] | None = None) -> None:
        def remember_lost() -> None:
            if caller is not None:
                self._lost_tasks[caller] = True

        hold = self._release_prepare(owner, remember_lost)
        call = self._release_call(owner)
        try:
            left = int(
                await _resend_once(lambda: self._release_sender()(keys=call.keys, args=call.args))
            )
        except BaseException as error:
            self._release_failed(hold, error, owner, call)
            raise
        self._release_settle(hold, left, "task", remember_lost)

    async def force_release(self) -> bool:
        """Delete the lock whoever holds it and wake its waiters; True if it was held."""
        call = self._force_release_call()
        with self._reachable("force-release"):
            reply = await self._force_release_sender()(keys=call.keys, args=call.args)
        return bool(reply)  # as RLock.force_release

    # -- inspecting ---------------------------------------------------------------

    async def locked(self) -> bool:
        """True when anyone holds the lock."""
        with self._reachable("inspect"):
            return bool(await self.client.redis.exists(self.keys.hash))

    async def owned(self) -> bool:
        """True when the current task holds the lock (asks Redis, as :meth:`RLock.owned`)."""
        with self._reachable("inspect"):
            return bool(await self.client.redis.hexists(self.keys.hash, task_owner()))

    async def hold_count(self) -> int:
        """How many holds the current task has on the lock (0 when none; asks Redis)."""
        with self._reachable("inspect"):
            return hold_count_reply(await self.client.redis.hget(self.keys.hash, task_owner()))

    async def ttl(self) -> float | None:
        """Seconds until the lock expires, None when nobody holds it (inf: no expiry)."""
        with self._reachable("inspect"):
            return ttl_reply(await self.client.redis.pttl(self.keys.hash))

    @property
    def token(self) -> int | None:
        """The fencing token of the current task's hold, None when it holds none."""
        return self._token_of(task_owner())

    @property
    def lost(self) -> bool:
        """True when the current task's current hold on this lock was lost (see RLock.lost).

        A new grant clears it at once, whether the lost hold was released or not.
        """
        current = self._current_lost(task_owner())
        if current is not None:
            return current
        task = asyncio.current_task()
        return task is not None and self._lost_tasks.get(task, False)

    def on_lost(self, callback: Callable[[AsyncRLock], object]) -> None:
        """Call ``callback(self)`` on this event loop when a hold taken through this lock is lost.

        ``callback`` may be a coroutine function; it then runs as a task.
        """
        loop = asyncio.get_running_loop()

        def on_loop(_lock: object) -> None:
            loop.call_soon_threadsafe(_run, callback, self)

        self.lost_callbacks.append(on_loop)


async def _resend_once(call: Callable[[], Awaitable[Any]]) -> Any:
    """:func:`django_rlock.core.lock.resend_once` for coroutines."""
    try:
        return await call()
    except LOST_REPLY:
        return await call()


class _AsyncWaiting:
    """The asyncio shell of an :class:`AcquirePlan`: the script calls and the subscription."""

    def __init__(self, lock: AsyncRLock, owner: str, lease: float | None, started: float) -> None:
        self.lock, self.owner, self.lease, self.started = lock, owner, lease, started
        self.subscription: AsyncSubscription | None = None

    def attempt(self, waiter: bool, sleep: float) -> Awaitable[float | None]:
        waiter_id = self.subscription.waiter_id if waiter and self.subscription else ""
        return self.lock._attempt(self.owner, self.lease, waiter_id, sleep, self.started)

    def listen(self) -> None:
        self.subscription = self.lock.client.listener.subscribe(self.lock.keys.channel)

    def close(self, *, registered: bool) -> None:
        if self.subscription is None:
            return
        self.lock.client.listener.unsubscribe(self.subscription)
        if registered:
            self.lock.client.spawn(self.lock._abandon(self.subscription.waiter_id))


def _run(callback: Callable[[AsyncRLock], object], lock: AsyncRLock) -> None:
    result = callback(lock)
    if isinstance(result, Coroutine):
        asyncio.ensure_future(result)  # noqa: RUF006 -- the loop keeps it until it ends
