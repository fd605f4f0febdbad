"""The asyncio engine's plain lock, AsyncRLock, which the other kinds' shells extend.

The twin of ``_sync/locks.py``, over the same protocol (``_protocol/``): the
same calls, awaited, with the current task as the owner. The other kinds'
shells are in the modules named as their threaded twins (``_aio/fairlock.py``,
``rwlock.py``, ``semaphore.py``, ``redisson.py``).

AsyncRLock: the asyncio twin of :class:`django_rlock.core.RLock`.

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
Each acquire and release call runs in its caller's task: it is written before
the caller first awaits, and its reply is read by the client's connection, so
a cancellation never leaves it half-done. The client finishes the call of a
cancelled caller in a task of its own (giving a grant back, settling a
release), and the same task's next call waits for that first
(:meth:`~django_rlock.core.aio.AsyncLockClient.finish_for`): a cancelled call is
never sent again after the task's next one (which it could undo).

"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar, Unpack, cast

from redis.exceptions import NoPermissionError, OutOfMemoryError, RedisError

from django_rlock.core._aio.shell import AsyncShell, Client
from django_rlock.core._process.holder import DESCRIPTION_FIELDS, read_hold
from django_rlock.core._process.identity import current_task_owner, task_owner
from django_rlock.core._protocol import clock
from django_rlock.core._protocol.calls import (
    ScriptCall,
    extend_call,
    hold_count_reply,
    ttl_reply,
)
from django_rlock.core._protocol.deadlocks import (
    Cycle,
    DeadlockScripts,
    DeadlockWaiter,
    Detector,
    deadlock_error,
)
from django_rlock.core._protocol.lock import (
    STARVING_AFTER,
    UNANSWERED,
    KindScripts,
    LockOptions,
    LockScripts,
)
from django_rlock.core._protocol.lockbase import LockBase
from django_rlock.core._protocol.plan import HANDED, AcquirePlan, drive_async
from django_rlock.core.exceptions import DeadlockError, LockNotOwnedError, LockUnavailableError

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from django_rlock.core._aio.waiting import AsyncSubscription
    from django_rlock.core._protocol.holds import Hold

T = TypeVar("T")

logger = logging.getLogger("django_rlock.lock")


class AsyncRLock(DeadlockWaiter, LockBase):
    """A reentrant distributed lock for asyncio; get one from :meth:`AsyncLockClient.lock`."""

    def __init__(self, client: Client, name: str, **options: Unpack[LockOptions]) -> None:
        super().__init__(client.engine, name, **options)
        self.client = client
        # Whether this is the plain lock, whose release hands the lock over to
        # a starving waiter (see the sync RLock's _packs_calls).
        self._hands_over = (
            client.engine.min_replicas == 0
            and self._sends_plain_calls()
            and type(self)._kind_scripts is AsyncRLock._kind_scripts
        )
        # Whether the first attempt of an acquire is the plain shell's own
        # (no queue id, no waiter): sent without making a shell (see _acquire).
        self._first_alone = type(self)._waiting_shell is AsyncRLock._waiting_shell
        # Tasks whose last hold through this object ended lost (see `lost`).
        self._lost_tasks: weakref.WeakKeyDictionary[asyncio.Task[Any], bool] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:
        return f"<AsyncRLock {self.name!r}>"

    # -- acquiring ----------------------------------------------------------------

    def acquire(
        self, blocking: bool = True, timeout: float | None = None, lease: float | None = None
    ) -> Coroutine[Any, Any, bool]:
        """Take the lock (or one more hold on it); True when held. See :meth:`RLock.acquire`.

        Await it. The hold's owner is the task that *calls* ``acquire()``,
        bound as it is called: ``await asyncio.wait_for(lock.acquire(), 5)``,
        ``asyncio.shield(lock.acquire())``, ``asyncio.gather(...)`` and a
        ``TaskGroup`` run the call in a task of their own, which ends once the
        lock is granted; the hold is the caller's, who releases it.
        """
        return self._acquire(blocking, timeout, lease, current_task_owner())

    async def _acquire(
        self, blocking: bool, timeout: float | None, lease: float | None, owner: str | None
    ) -> bool:
        plan, lease_seconds = self._plan(blocking, timeout, lease)
        with self._reachable("acquire"):
            # Outside a task when called (``asyncio.run(lock.acquire())``): the
            # task that runs it owns the hold.
            owner = owner or task_owner()
            lease_seconds = self._granted_lease(owner, lease_seconds)
            if not self._first_alone:
                return await self._acquire_waiting(plan, lease_seconds, owner)
            # The plan's first step, one attempt that does not wait, is sent
            # here, as the plain shell would send it: an uncontended grant (the
            # common case) makes no shell and drives no generator. Nothing is
            # left to clean up if it fails: it registers no waiter.
            sent_at = clock.monotonic()
            first = await self._attempt(owner, lease_seconds, "", 0.0, plan.started)
            if first is None:
                return True
            return await self._acquire_waiting(plan, lease_seconds, owner, first, sent_at)

    async def _acquire_waiting(
        self,
        plan: AcquirePlan,
        lease_seconds: float | None,
        owner: str,
        first: float | None = None,
        sent_at: float | None = None,
    ) -> bool:
        """Run ``plan`` for ``owner`` after the first attempt if sent (``sent_at``: when)."""
        shell = self._waiting_shell(owner, lease_seconds, plan)
        try:
            if sent_at is None:
                # The plan's first step, one attempt that does not wait, is sent
                # here: an uncontended grant drives no generator.
                first = await shell.attempt(False, 0.0)
            else:
                cast("_AsyncWaiting", shell).sent_at = sent_at
            granted = await drive_async(plan, shell, first)
        except DeadlockError as error:
            shell.close(registered=plan.registered)  # out of the graph before it is told
            self._gave_up(owner, plan, error)
            raise
        except BaseException:
            # No await: a cancelled acquire still leaves nothing behind.
            shell.close(registered=plan.registered)
            raise
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
        """One acquire script call: None when granted, else seconds to wait at most.

        If the caller is cancelled while the call is on its way, the call
        still lands, and a grant it brings is given back at once.
        """
        client = self.client
        if client.unfinished:
            await client.finished(owner)  # nothing is sent before: a cancellation leaves nothing
        call = self._acquire_call(owner, lease, waiter_id, sleep)
        script: Any = self._acquire_sender()  # a WireScript: its SHA now
        packed = self._packed_acquire(script.sha, owner, lease, call) if self._hands_over else None
        sent_at = clock.monotonic()
        flight = client.send(script, call, packed)
        caller = asyncio.current_task()
        try:
            reply = await flight.waiter
        except asyncio.CancelledError:
            landed = flight.hand_over()
            client.finish_for(
                owner,
                self._give_back(landed, owner, lease, call=call, sent_at=sent_at, caller=caller),
            )
            raise
        except (OutOfMemoryError, *UNANSWERED) as error:
            self._acquire_failed(error, owner, call)
        return self._acquire_landed(
            reply, owner, lease, sent_at, requested_at=requested_at, caller=caller
        )

    def _acquire_landed(
        self,
        reply: Any,
        owner: str,
        lease: float | None,
        sent_at: float,
        *,
        requested_at: float | None,
        caller: asyncio.Task[Any] | None,
    ) -> float | None:
        wait = self._acquire_reply(reply, owner, lease, sent_at, requested_at)
        if wait is None and caller is not None:
            self._lost_tasks.pop(caller, None)
        return wait

    async def _give_back(
        self,
        landed: asyncio.Future[Any],
        owner: str,
        lease: float | None,
        *,
        call: ScriptCall,
        sent_at: float,
        caller: asyncio.Task[Any] | None,
    ) -> None:
        """The end of an acquire whose caller was cancelled on its way: a grant goes back."""
        try:
            reply = await landed
        except (OutOfMemoryError, *UNANSWERED) as error:
            with contextlib.suppress(Exception):
                self._acquire_failed(error, owner, call)  # noted: the next acquire asks again
            return
        wait = self._acquire_landed(reply, owner, lease, sent_at, requested_at=None, caller=caller)
        if wait is None:
            await self._release_as(owner, ordered=False)

    def _kind_scripts(self) -> KindScripts:
        return KindScripts.of(self.client.scripts[LockScripts])

    #: This lock's row of scripts, looked up on its first call: every kind's
    #: row is fixed once its client is built.
    _row: KindScripts | None = None

    def _scripts_row(self) -> KindScripts:
        row = self._row
        if row is None:
            row = self._row = self._kind_scripts()
        return row

    def _acquire_sender(self) -> Callable[..., Any]:
        return self._scripts_row().acquire

    def _release_sender(self) -> Callable[..., Any]:
        return self._scripts_row().release

    def _waiting_shell(self, owner: str, lease: float | None, plan: AcquirePlan) -> AsyncShell:
        """The shell that runs ``plan``'s calls for ``owner`` (a sibling may queue its own)."""
        return _AsyncWaiting(self, owner, lease, plan.started)

    async def _abandon(self, waiter_id: str) -> None:
        call = self._abandon_call(waiter_id)
        await self._abandon_sender()(keys=call.keys, args=call.args)

    # -- deadlock detection (see _protocol/deadlocks.py) ---------------------------

    async def _check_deadlock(self, detector: Detector, started: float) -> None:
        """Write or renew the task's wait edge, then look for a cycle (as :class:`RLock`'s)."""
        redis_client = self.client.redis
        scripts = self.client.scripts[DeadlockScripts]
        steps = detector.check()
        reply: Any
        try:
            read = next(steps)
            while True:
                if read[0] == "edge":
                    reply = await redis_client.get(read[1])
                elif read[0] == "renew":
                    reply = await redis_client.pexpire(read[1], read[2])
                elif read[0] == "write":
                    reply = await redis_client.set(read[1], read[2], px=read[3])
                else:
                    call = read[1]
                    reply = await getattr(scripts, read[0])(keys=call.keys, args=call.args)
                read = steps.send(reply)
        except StopIteration as done:
            cycle = cast("Cycle | None", done.value)
        except NoPermissionError:
            raise  # as for every call of the engine: the ACL must be fixed, not worked around
        except RedisError as error:
            logger.debug("deadlock check on %r skipped: %s", self.name, type(error).__name__)
            return
        if cycle is not None:
            raise deadlock_error(self._engine.key_prefix, self.name, cycle, started)

    async def _forget_edge(self, detector: Detector) -> None:
        """Delete the task's wait edge as its wait ends (a failure leaves it to expire)."""
        try:
            await self.client.redis.delete(detector.key)
        except RedisError as error:
            logger.debug("could not delete a wait edge of %r: %s", self.name, type(error).__name__)

    async def __aenter__(self) -> Self:
        if not await self.acquire(self.blocking, self.timeout, self.lease):
            raise self._timeout_error(*await self._busy_state())
        return self

    async def _busy_state(self) -> tuple[float | None, dict[str, Any] | None]:
        """For a busy caller's error: the key's seconds left, and who holds it (as sync's)."""
        remaining = await self.ttl()
        if remaining is None:
            return None, None
        try:
            return remaining, await self.holder()
        except LockUnavailableError:
            return remaining, None

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.release()

    # -- releasing ----------------------------------------------------------------

    def release(self) -> Coroutine[Any, Any, None]:
        """Give back one hold, as :meth:`RLock.release` does; await it.

        The owner is the task that calls ``release()`` (see :meth:`acquire`).
        If the caller is cancelled meanwhile, the release completes anyway
        (and the cancellation still propagates).
        """
        owner = current_task_owner()
        return self._release(owner, asyncio.current_task() if owner is not None else None)

    async def _release(self, owner: str | None, caller: asyncio.Task[Any] | None) -> None:
        with self._reachable("release"):
            await self._release_as(owner or task_owner(), caller or asyncio.current_task())

    def extend(self, seconds: float) -> Coroutine[Any, Any, None]:
        """The task's fixed lease now ends ``seconds`` from now; see :meth:`RLock.extend`.

        Await it; the owner is the task that calls ``extend()`` (see :meth:`acquire`).
        """
        return self._extend(seconds, current_task_owner())

    async def _extend(self, seconds: float, owner: str | None) -> None:
        owner = owner or task_owner()
        hold = self._extend_prepare(owner, seconds, "task")
        call = extend_call(*self.hold_keys(owner), owner, seconds)
        sent_at = clock.monotonic()
        with self._reachable("extend"):
            try:
                reply = await self.client.scripts[LockScripts].renew(keys=call.keys, args=call.args)
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

    async def _release_as(
        self, owner: str, caller: asyncio.Task[Any] | None = None, *, ordered: bool = True
    ) -> None:
        """Release one hold of ``owner``'s; finished by the client if the caller is cancelled.

        ``ordered``: first wait for the owner's unfinished call (False only in
        the client's finishing work, which runs after it already).
        """
        client = self.client
        if ordered and client.unfinished:
            try:
                await client.finished(owner)
            except asyncio.CancelledError:
                # Not begun: it is made all the same, after the owner's unfinished call.
                client.finish_for(owner, self._release_as(owner, caller, ordered=False))
                raise

        def remember_lost() -> None:
            if caller is not None:
                self._lost_tasks[caller] = True

        hold = self._release_prepare(owner, remember_lost)
        call = self._release_call(owner)
        script: Any = self._release_sender()
        packed = self._packed_release(script.sha, owner, call) if self._hands_over else None
        flight = client.send(script, call, packed)
        try:
            reply = await flight.waiter
        except asyncio.CancelledError:
            landed = flight.hand_over()
            client.finish_for(owner, self._release_landed(landed, hold, owner, call, remember_lost))
            raise
        except BaseException as error:
            self._release_failed(hold, error, owner, call)
            raise
        self._release_settle(hold, int(reply), "task", remember_lost)

    async def _release_landed(
        self,
        landed: asyncio.Future[Any],
        hold: Hold | None,
        owner: str,
        call: ScriptCall,
        remember_lost: Callable[[], None],
    ) -> None:
        """The end of a release whose caller was cancelled on its way."""
        try:
            reply = await landed
        except Exception as error:  # noqa: BLE001 -- nobody to tell but the hold registry
            self._release_failed(hold, error, owner, call)
            return
        # The caller is gone: what it would have been told (not its holder, or lost) is moot.
        with contextlib.suppress(LockNotOwnedError):
            self._release_settle(hold, int(reply), "task", remember_lost)

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

    async def holder(self) -> dict[str, Any] | None:
        """Who holds the lock now, as its grant described it (see ``RLock.holder``)."""
        key = self._description_key()
        if key is None:
            return None
        with self._reachable("inspect"):
            fields = await self.client.redis.hmget(key, DESCRIPTION_FIELDS)
        return read_hold(*fields)

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

    def _handed_over(self, waiting: _AsyncWaiting, subscription: AsyncSubscription) -> bool:
        """Take the grant a release handed ``waiting``'s caller, if any (LockBase)."""
        grant, subscription.handoff = subscription.handoff, b""
        if not self._take_hand_over(
            waiting.owner, waiting.lease, waiting.sent_at, waiting.started, grant
        ):
            return False
        task = asyncio.current_task()
        if task is not None:
            self._lost_tasks.pop(task, None)
        return True

    def on_lost(self, callback: Callable[[AsyncRLock], object]) -> None:
        """Call ``callback(self)`` on this event loop when a hold taken through this lock is lost.

        ``callback`` may be a coroutine function; it then runs as a task.
        """
        loop = asyncio.get_running_loop()

        def on_loop(_lock: object) -> None:
            loop.call_soon_threadsafe(_run, callback, self)

        self.lost_callbacks.append(on_loop)


class AsyncWaitingShellBase:
    """What every asyncio waiting shell (the plain lock's, the fair lock's) shares.

    The twin of the threaded ``WaitingShellBase``: its deadlock checks, and
    telling its lock whether a wake-up handed it the lock
    (:class:`AsyncHandOverSubscription`).
    """

    lock: AsyncRLock
    owner: str
    #: When the acquire call began (monotonic).
    started: float
    #: Made by the first deadlock check (most calls never wait that long).
    detector: Detector | None

    def check_deadlock(self) -> Awaitable[None]:
        detector = self.detector
        if detector is None:
            detector = self.detector = self.lock._detector(self.owner, self.started)
        return self.lock._check_deadlock(detector, self.started)

    def forget_edge(self) -> None:
        """Have the owner's next call (a release too) wait for its wait-for edge to go.

        The owner never runs on with an edge saying it waits (see
        ``_protocol/deadlocks.py``).
        """
        if self.detector is not None and self.detector.written:
            self.lock.client.finish_for(self.owner, self.lock._forget_edge(self.detector))

    def handed(self, subscription: AsyncSubscription) -> bool:
        """Whether the wake-up just read handed the caller the lock (taken, if so)."""
        raise NotImplementedError


class _AsyncWaiting(AsyncWaitingShellBase):
    """The asyncio shell of an :class:`AcquirePlan`: the script calls and the subscription."""

    def __init__(self, lock: AsyncRLock, owner: str, lease: float | None, started: float) -> None:
        self.lock, self.owner, self.lease, self.started = lock, owner, lease, started
        self.subscription: AsyncHandOverSubscription | None = None
        # Made by the first deadlock check (most calls never wait that long).
        self.detector: Detector | None = None
        #: When the last attempt was sent (at the latest): see the sync ``_Waiting``.
        self.sent_at = started

    def attempt(self, waiter: bool, sleep: float) -> Awaitable[float | None]:
        subscription = self.subscription
        waiter_id = subscription.waiter_id if waiter and subscription else ""
        if waiter_id and subscription is not None and self.lock._hands_over:
            woken = subscription.mark() > 0
            if woken or clock.monotonic() - self.started >= STARVING_AFTER:
                sleep = -sleep  # starving: asks to be handed the lock (scripts.ACQUIRE)
        self.sent_at = clock.monotonic()
        return self.lock._attempt(self.owner, self.lease, waiter_id, sleep, self.started)

    def listen(self) -> None:
        subscription = self.lock.client.listener.subscribe(self.lock.keys.channel)
        self.subscription = AsyncHandOverSubscription(self, subscription)

    def handed(self, subscription: AsyncSubscription) -> bool:
        return self.lock._handed_over(self, subscription)

    def close(self, *, registered: bool) -> None:
        if self.subscription is None:
            return
        self.lock.client.listener.unsubscribe(self.subscription.inner)
        self.forget_edge()
        if registered:
            # After the owner's cancelled attempt, if any: an ABANDON that overtook
            # it would leave the waiter it then registers in the set, to be woken in vain.
            lock = self.lock
            lock.client.finish_for(self.owner, lock._abandon(self.subscription.waiter_id))


class AsyncHandOverSubscription:
    """The asyncio twin of the sync ``HandOverSubscription``: a hand-over or handoff ends the plan.

    Nothing awaits between taking the grant and the plan's end, so a
    cancellation either comes before (the caller never counted the grant, and
    ABANDON or FAIR_ABANDON gives it back) or after (the caller holds the lock).
    """

    def __init__(self, shell: AsyncWaitingShellBase, subscription: AsyncSubscription) -> None:
        self.shell, self.inner = shell, subscription
        self.waiter_id = subscription.waiter_id

    async def wait_subscribed(self, timeout: float) -> bool:
        return await self.inner.wait_subscribed(timeout)

    def mark(self) -> int:
        return self.inner.mark()

    async def wait(self, since: int, timeout: float) -> object:
        woken = await self.inner.wait(since, timeout)
        return HANDED if self.shell.handed(self.inner) else woken


def _run(callback: Callable[[AsyncRLock], object], lock: AsyncRLock) -> None:
    result = callback(lock)
    if isinstance(result, Coroutine):
        asyncio.ensure_future(result)  # noqa: RUF006 -- the loop keeps it until it ends
