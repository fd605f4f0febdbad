"""The threaded engine's plain lock, RLock, which the other kinds' shells extend.

Each kind's shell is thin: it builds its calls with its kind's protocol
(``_protocol/lock.py`` and ``lockbase.py``; ``fairlock.py``, ``rwlock.py``,
``semaphore.py``), sends them on the client's connection, and drives the
acquire plan (``_protocol/plan.py``) with blocking waits. The other kinds'
shells are in the modules of the same names here (``_sync/fairlock.py``,
``rwlock.py``, ``semaphore.py``, ``redisson.py``); their asyncio twins, with
the same file names, are in ``_aio/``.

RLock: Redisson's reentrant lock, in Python.

A lock is one Redis hash: field = owner id, value = hold count. The owner is
the calling thread of this process, so one RLock object may be shared by many
threads, each its own owner, exactly like ``threading.RLock``::

    client = LockClient("redis://127.0.0.1:6379/0")
    lock = client.lock("order:42")
    with lock:                       # waits as long as it takes
        with lock:                   # re-entry: same owner, hold count 2
            charge(order, fence=lock.token)

    if lock.acquire(timeout=3):      # wait at most 3 s
        try: ...
        finally: lock.release()

``lease=None`` (the default) keeps the lock alive through the watchdog for as
long as the holder lives; ``lease=10`` gives a fixed 10-second expiry instead.

"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Unpack, cast

from redis.exceptions import (
    NoPermissionError,
    OutOfMemoryError,
    RedisClusterException,
    RedisError,
)

from django_rlock.core._process import lostholds
from django_rlock.core._process.holder import DESCRIPTION_FIELDS, describe, read_hold
from django_rlock.core._process.identity import (
    forget_former_thread_owner,
    former_thread_owners,
    thread_owner,
)
from django_rlock.core._protocol import clock
from django_rlock.core._protocol.calls import (
    NOT_WAITING,
    ScriptCall,
    acquire_call,
    extend_call,
    hold_count_reply,
    no_lost_tail,
    release_call,
    sleep_ms,
    ttl_reply,
)
from django_rlock.core._protocol.deadlocks import (
    Cycle,
    DeadlockScripts,
    DeadlockWaiter,
    Detector,
    deadlock_error,
)
from django_rlock.core._protocol.holds import registries
from django_rlock.core._protocol.lock import (
    LOST_REPLY,
    STARVING_AFTER,
    UNANSWERED,
    KindScripts,
    LockOptions,
    LockScripts,
)
from django_rlock.core._protocol.lockbase import LockBase
from django_rlock.core._protocol.plan import HANDED, NOT_SENT, SUBSCRIBED, AcquirePlan, drive
from django_rlock.core._protocol.unavailable import SLOT_MOVING, UNREACHABLE, unavailable_error
from django_rlock.core._sync.scripts import LockScript, OomSafeScript, run_packed
from django_rlock.core._sync.sharding import resend_while_settling
from django_rlock.core._sync.shell import Client, SyncShell
from django_rlock.core._sync.waiting import lingers, subscribed_first
from django_rlock.core._sync.wire import HeldClient
from django_rlock.core.exceptions import (
    DeadlockError,
    LockUnavailableError,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    import redis

    from django_rlock.core._protocol.holds import Hold
    from django_rlock.core._sync.waiting import Waiting

logger = logging.getLogger("django_rlock.lock")


# Lock class -> whether it sends the plain lock's calls (see RLock._plain_calls).
_plain_kinds: dict[type[RLock], bool] = {}


class RLock(DeadlockWaiter, LockBase):
    """A reentrant distributed lock; get one from :meth:`LockClient.lock`."""

    def __init__(self, client: Client, name: str, **options: Unpack[LockOptions]) -> None:
        super().__init__(client, name, **options)
        self.client = client
        self._packs_calls = client.min_replicas == 0 and self._plain_calls()

    def _plain_calls(self) -> bool:
        """Whether this class sends the plain lock's calls, whose encoding :meth:`_templates` keeps.

        Worked out once per class (the Django face makes a lock object per block).
        """
        kind = type(self)
        plain = _plain_kinds.get(kind)
        if plain is None:
            plain = _plain_kinds[kind] = (
                self._sends_plain_calls()
                and kind._kind_scripts is RLock._kind_scripts
                and kind._waiting_shell is RLock._waiting_shell
            )
        return plain

    def __repr__(self) -> str:
        return f"<RLock {self.name!r}>"

    @property
    def _local(self) -> threading.local:
        """Per thread: whether this thread's last hold through this object ended lost.

        Made on first need: the Django face makes a lock object per block, and
        most are never lost (a grant only clears it if it exists, :meth:`_clear_lost`).
        """
        local = self.__dict__.get("_thread_state")
        if local is None:
            # setdefault: two threads making it at once keep the same one.
            local = self.__dict__.setdefault("_thread_state", threading.local())
        return cast(threading.local, local)

    def _clear_lost(self) -> None:
        """A grant: this thread's last hold through this object is no longer a lost one."""
        local = self.__dict__.get("_thread_state")
        if local is not None:
            local.lost = False

    def _owner(self) -> str:
        """The calling thread's owner id for this lock.

        Its current id, unless it holds this lock under a former id (kept when
        a unit of work retired the id while the thread still held locks taken
        before that unit, see :mod:`~django_rlock.core._process.leaks`): then
        that one, so that it re-enters and releases what it holds. A former id
        that holds nothing any more is dropped on the way.
        """
        owner = thread_owner()
        formers = former_thread_owners()
        if not formers or self._registry.peek(self.hold_keys(owner)[0], owner) is not None:
            return owner
        for former in list(formers):
            if self._registry.peek(self.hold_keys(former)[0], former) is not None:
                return former
            if not any(registry.owns_any(former) for registry in registries()):
                forget_former_thread_owner(former)
        return owner

    # -- acquiring ----------------------------------------------------------------

    def acquire(
        self, blocking: bool = True, timeout: float | None = None, lease: float | None = None
    ) -> bool:
        """Take the lock (or one more hold on it); True when held.

        ``blocking=False`` makes one attempt. Otherwise wait up to ``timeout``
        seconds (None: as long as it takes), woken by the holder's release or by
        the end of its lease, whichever comes first: never by a fixed poll.
        ``lease`` is a fixed expiry in seconds; None means the watchdog renews
        the lock until it is released.
        """
        plan, lease_seconds = self._plan(blocking, timeout, lease)
        try:
            return self._acquire_waiting(plan, lease_seconds)
        except UNREACHABLE as error:  # what _reachable does, without a context object
            raise unavailable_error(self._engine.server, "acquire", self.name, error) from error

    def _acquire_waiting(self, plan: AcquirePlan, lease_seconds: float | None) -> bool:
        owner = self._owner()
        lease_seconds = self._granted_lease(owner, lease_seconds)
        first: Any = NOT_SENT
        if self._packs_calls:
            # The plan's first step, one attempt that does not wait, is sent here,
            # before any shell is made: an uncontended grant needs none. Not sent
            # when the lock's channels linger (it is most likely held again).
            if subscribed_first(plan, self.client.listener, self):
                first = SUBSCRIBED
            else:
                first = self._attempt(
                    owner,
                    lease_seconds,
                    requested_at=plan.started,
                    until=plan.deadline if plan.blocking else 0.0,
                )
                if first is None:
                    return True
        shell = self._waiting_shell(owner, lease_seconds, plan)
        try:
            if first is NOT_SENT:
                # Sent by the shell, whose kind may queue it (a fair lock's first
                # attempt carries its queue id): an uncontended grant drives no generator.
                first = shell.attempt(False, 0.0)
            granted = drive(plan, shell, first)
        except DeadlockError as error:
            shell.close(registered=plan.registered)  # out of the graph before it is told
            self._gave_up(owner, plan, error)
            raise
        except BaseException:
            shell.close(registered=plan.registered)
            raise
        shell.close(registered=plan.registered)
        if not granted:
            self._gave_up(owner, plan)
        return granted

    def _attempt(
        self,
        owner: str,
        lease: float | None,
        waiter_id: str = "",
        sleep: float = 0.0,
        *,
        via: redis.Redis | None = None,
        requested_at: float | None = None,
        until: float = 0.0,
    ) -> float | None:
        """One acquire script call: None when granted, else seconds to wait at most.

        A ``waiter_id`` enters the caller in the lock's waiting set, so that a
        release can wake it alone; ``sleep`` is how long it will wait at most.
        ``via`` is another connection to the same server to send it on (RedLock
        uses one with a short timeout); ``requested_at`` is when the caller's
        acquire began. A call a cluster refuses while the slot moves is sent
        again until ``until`` (the caller's deadline; 0: once), and for no more
        than the watchdog timeout (see :func:`resend_while_settling`).
        """
        if via is None and self._packs_calls:
            held = self.client.held()
            if isinstance(held, HeldClient):
                return self._attempt_packed(
                    held, owner, lease, waiter_id=waiter_id, sleep=sleep, requested_at=requested_at
                )
        call = self._acquire_call(owner, lease, waiter_id, sleep)
        send_acquire = self._acquire_sender()
        sent_at = clock.monotonic()
        try:
            if via is not None:
                # RedLock bounds each server to one short attempt: no resend.
                reply = send_acquire(keys=call.keys, args=call.args, client=via)
            else:
                held = self.client.held()

                def send() -> Any:
                    nonlocal sent_at
                    sent_at = clock.monotonic()  # a grant's life counts from its own send
                    try:
                        return send_acquire(keys=call.keys, args=call.args, client=held)
                    except LOST_REPLY:  # see resend_once: same call, same request id
                        return send_acquire(keys=call.keys, args=call.args, client=held)

                bound = min(until, sent_at + self._engine.watchdog_timeout)
                reply = resend_while_settling(send, bound)
        except (OutOfMemoryError, *UNANSWERED) as error:
            self._acquire_failed(error, owner, call)
        except SLOT_MOVING:
            # Refused, so never run; its id is kept as an unanswered one's is,
            # in case the call it resent (an earlier unanswered one) did run.
            self._unanswered("acquire", owner, call.rid)
            raise
        wait = self._acquire_reply(reply, owner, lease, sent_at, requested_at)
        if wait is None:
            self._clear_lost()
        return wait

    def _attempt_packed(
        self,
        held: HeldClient,
        owner: str,
        lease: float | None,
        *,
        waiter_id: str,
        sleep: float,
        requested_at: float | None,
    ) -> float | None:
        """:meth:`_attempt` on the thread's held connection, the call packed from its template.

        The same call as :meth:`_acquire_call` makes (see :attr:`_packs_calls`),
        with the same request id, lost holds and holder; only its encoding is
        kept from call to call (:meth:`_templates`).
        """
        rid = self._request_id("acquire", owner)
        lost = lostholds.lost_on_server(self.keys.hash, owner)
        holder = describe(lease)
        script = cast("LockScript", (self._row or self._scripts_row()).acquire)
        template = self._templates(owner, lease)[0]
        if lost is None and not waiter_id and not sleep:
            # Uncontended (the common call): all but the request id encoded already.
            packed = template.pack_fresh(script.sha, NOT_WAITING, rid, no_lost_tail(holder))
        else:
            token, holds = lost or (0, 0)
            packed = template.pack(
                script.sha, waiter_id, sleep_ms(sleep), rid, holds, str(token), holder, fresh=rid
            )

        def call() -> ScriptCall:
            ttl = self._ttl_of(lease)
            return acquire_call(
                self.keys, owner, ttl=ttl, waiter_id=waiter_id, sleep=sleep, rid=rid,
                lost=lost, holder=holder,
            )  # fmt: skip

        sent_at = clock.monotonic()
        try:
            try:
                reply = run_packed(script, held, packed, call)
            except LOST_REPLY:  # see resend_once: same call, same request id
                reply = run_packed(script, held, packed, call)
        except (OutOfMemoryError, *UNANSWERED) as error:
            self._acquire_failed(error, owner, call())
        wait = self._acquire_reply(reply, owner, lease, sent_at, requested_at)
        if wait is None:
            self._clear_lost()
        return wait

    #: Whether this lock's acquire and release calls are the plain lock's, whose
    #: templates :meth:`_templates` makes: a sibling kind with calls of its own
    #: (fair, read-write, semaphore, another layout) and a client whose acquire
    #: waits for replicas send theirs by :meth:`_acquire_call` and :meth:`_release_call`.
    _packs_calls = False

    def _kind_scripts(self) -> KindScripts:
        scripts = self.client.scripts[LockScripts]
        # Acquire alone may wait for replicas (min_replicas): the client's sender knows.
        return KindScripts(
            self.client.send_acquire, scripts.release, scripts.abandon, scripts.force_release
        )

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

    def _waiting_shell(self, owner: str, lease: float | None, plan: AcquirePlan) -> SyncShell:
        """The shell that runs ``plan``'s calls for ``owner`` (a sibling may queue its own)."""
        return _Waiting(self, owner, lease, plan)

    def attempt_as(self, owner: str, lease: float | None, *, via: redis.Redis | None) -> bool:
        """One acquire call for ``owner``, no waiting: True when granted.

        For lock groups (:class:`~django_rlock.core._sync.multilock.RedLock`), which
        try each member once on its own short-timeout connection ``via``.
        Raises what the call raised: the group decides what an error means.
        """
        return self._attempt(owner, lease, via=via) is None

    def release_as(self, owner: str, *, via: redis.Redis | None) -> int:
        """One release call for ``owner`` on ``via``, with no bookkeeping: the holds left.

        For lock groups (:class:`~django_rlock.core._sync.multilock.RedLock`), to
        give back a grant :meth:`attempt_as` may have made though its reply was
        lost (so nothing here records it). The lock's own keys and script, in
        its layout: a full release wakes the waiters of either side. -1 when
        ``owner`` held nothing; raises what the call raised.
        """
        call = self._release_call(owner)
        return int(self._release_sender()(keys=call.keys, args=call.args, client=via))

    def _handed_over(self, waiting: _Waiting, subscription: Waiting) -> bool:
        """Take the grant a release handed ``waiting``'s caller, if any (LockBase)."""
        grant, subscription.handoff = subscription.handoff, b""
        if not self._take_hand_over(
            waiting.owner, waiting.lease, waiting.sent_at, waiting.started, grant
        ):
            return False
        self._local.lost = False
        return True

    def _abandon(self, waiter_id: str) -> None:
        """Leave the waiting set without the lock, passing on a wake-up meant for us."""
        call = self._abandon_call(waiter_id)
        try:
            self._abandon_sender()(keys=call.keys, args=call.args)
        except Exception:
            logger.debug("could not leave the waiting set of %r", self.name, exc_info=True)

    # -- deadlock detection (see _protocol/deadlocks.py) ---------------------------

    def _check_deadlock(self, detector: Detector, started: float) -> None:
        """Write or renew the caller's wait edge, then look for a cycle through it.

        Raises :class:`DeadlockError` when a confirmed cycle names the caller
        its victim (:meth:`Detector.check` decides). A failed Redis call skips
        this check (the wait goes on, and the next check tries again):
        detection never fails an acquire.
        """
        redis_client = self.client.redis
        scripts = self.client.scripts[DeadlockScripts]
        steps = detector.check()
        reply: Any
        try:
            read = next(steps)
            while True:
                if read[0] == "edge":
                    reply = redis_client.get(read[1])
                elif read[0] == "renew":
                    reply = redis_client.pexpire(read[1], read[2])
                elif read[0] == "write":
                    reply = redis_client.set(read[1], read[2], px=read[3])
                else:
                    call = read[1]
                    reply = getattr(scripts, read[0])(keys=call.keys, args=call.args)
                read = steps.send(reply)
        except StopIteration as done:
            cycle = cast("Cycle | None", done.value)
        except NoPermissionError:
            raise  # as for every call of the engine: the ACL must be fixed, not worked around
        except (RedisError, RedisClusterException) as error:
            logger.debug("deadlock check on %r skipped: %s", self.name, type(error).__name__)
            return
        if cycle is not None:
            raise deadlock_error(self._engine.key_prefix, self.name, cycle, started)

    def _forget_edge(self, detector: Detector) -> None:
        """Delete the caller's wait edge as its wait ends (a failure leaves it to expire)."""
        try:
            self.client.redis.delete(detector.key)
        except (RedisError, RedisClusterException) as error:
            logger.debug("could not delete a wait edge of %r: %s", self.name, type(error).__name__)

    def __enter__(self) -> RLock:
        if not self.acquire(self.blocking, self.timeout, self.lease):
            raise self._timeout_error(*self._busy_state())
        return self

    def _busy_state(self) -> tuple[float | None, dict[str, Any] | None]:
        """For a busy caller's error: the key's seconds left, and who holds it.

        The holder is read after the TTL and may be a newer grant's; an error
        reading it costs only the message its detail.
        """
        remaining = self.ttl()
        if remaining is None:
            return None, None
        try:
            return remaining, self.holder()
        except LockUnavailableError:
            return remaining, None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()

    # -- releasing ----------------------------------------------------------------

    def release(self) -> None:
        """Give back one hold; the lock is free when the last hold is released.

        Raises :class:`LockNotOwnedError` (changing nothing) when the calling
        thread holds nothing, and :class:`LockLostError` when its hold expired
        or was taken over before this release.
        """
        self._release_owned(self._owner())

    def _release_owned(self, owner: str) -> None:
        """Give back one hold of ``owner`` (the calling thread, or a leaked hold's owner)."""
        client = self.client
        hold = self._release_prepare(owner, self._remember_lost)
        try:
            # A thread's first call through this client connects its held connection.
            held = client.held()
        except UNREACHABLE as error:
            self._release_failed(hold, error, owner, self._release_call(owner))
            raise unavailable_error(self._engine.server, "release", self.name, error) from error
        if self._packs_calls and isinstance(held, HeldClient):
            left = self._release_packed(held, hold, owner)
        else:
            call = self._release_call(owner)
            with self._reachable("release"):
                try:
                    release = self._release_sender()

                    def send() -> int:
                        try:
                            return int(release(keys=call.keys, args=call.args, client=held))
                        except LOST_REPLY:  # see resend_once: same call, same request id
                            return int(release(keys=call.keys, args=call.args, client=held))

                    left = resend_while_settling(send, self._release_bound(hold))
                except BaseException as error:
                    self._release_failed(hold, error, owner, call)
                    raise
        self._release_settle(hold, left, "thread", self._remember_lost)

    def _release_bound(self, hold: Hold | None) -> float:
        """Until when a release refused by a moving cluster slot is sent again.

        As long as the hold would live if the release failed (its key expires
        then anyway), and no longer than the watchdog timeout.
        """
        now = clock.monotonic()
        longest = self._engine.watchdog_timeout
        return now + (longest if hold is None else min(max(hold.deadline - now, 0.0), longest))

    def _release_packed(self, held: HeldClient, hold: Hold | None, owner: str) -> int:
        """:meth:`_release_owned`'s call, packed from its template (as :meth:`_attempt_packed`)."""
        rid = self._request_id("release", owner)
        script = cast("OomSafeScript", (self._row or self._scripts_row()).release)
        packed = self._templates(owner, None)[1].pack_fresh(script.sha, b"", rid, b"")

        def call() -> ScriptCall:
            return release_call(self.keys, owner, self._engine.publish_command, rid)

        try:
            try:
                return int(run_packed(script, held, packed, call))
            except LOST_REPLY:  # see resend_once: same call, same request id
                return int(run_packed(script, held, packed, call))
        except BaseException as error:
            self._release_failed(hold, error, owner, call())
            if isinstance(error, UNREACHABLE):  # what _reachable does
                raise unavailable_error(self._engine.server, "release", self.name, error) from error
            raise

    def _remember_lost(self) -> None:
        self._local.lost = True

    def give_back_leaked(self, hold: Hold) -> None:
        """Release every hold of a leaked ``hold``'s owner (see :mod:`~._process.leaks`)."""
        for _ in range(hold.count):
            self._release_owned(hold.owner)

    def extend(self, seconds: float) -> None:
        """The calling thread's fixed lease now ends ``seconds`` from now (longer or shorter).

        Raises :class:`LockNotOwnedError` when the thread holds nothing,
        :class:`LockLostError` when its hold was lost, and :class:`LockError`
        for a hold the watchdog renews (it has no fixed lease to move).
        """
        owner = self._owner()
        hold = self._extend_prepare(owner, seconds, "thread")
        call = extend_call(*self.hold_keys(owner), owner, seconds)
        sent_at = clock.monotonic()
        with self._reachable("extend"):
            try:
                reply = self.client.scripts[LockScripts].renew(keys=call.keys, args=call.args)
            except BaseException:
                self._extend_failed(hold, sent_at, seconds)
                raise
        self._extend_settle(hold, sent_at, reply)

    def force_release(self) -> bool:
        """Delete the lock whoever holds it and wake its waiters; True if it was held.

        For operators and recovery code: the holder learns of it at its next
        renewal or release (as a lost lock).
        """
        call = self._force_release_call()
        with self._reachable("force-release"):
            reply = self._force_release_sender()(keys=call.keys, args=call.args)
        # Every kind's script answers 0 when nothing was held (1, or the readers deleted).
        return bool(reply)

    # -- inspecting ---------------------------------------------------------------

    def locked(self) -> bool:
        """True when anyone holds the lock."""
        with self._reachable("inspect"):
            return bool(self.client.redis.exists(self.keys.hash))

    def owned(self) -> bool:
        """True when the calling thread holds the lock (asks Redis)."""
        with self._reachable("inspect"):
            return bool(self.client.redis.hexists(self.keys.hash, self._owner()))

    def hold_count(self) -> int:
        """How many holds the calling thread has on the lock (0 when none; asks Redis)."""
        with self._reachable("inspect"):
            return hold_count_reply(self.client.redis.hget(self.keys.hash, self._owner()))

    def ttl(self) -> float | None:
        """Seconds until the lock expires, None when nobody holds it (inf: no expiry)."""
        with self._reachable("inspect"):
            return ttl_reply(self.client.redis.pttl(self.keys.hash))

    def holder(self) -> dict[str, Any] | None:
        """Who holds the lock now, as its grant described it; None when free or not described.

        The keys of ``manage.py rlock inspect --json``'s ``holder`` (``host``,
        ``pid``, ``thread``, ``task_id``, ``task_name``, ``acquired_at``), and
        ``lease``: the grant's fixed lease in seconds, None for a hold the
        watchdog renews until it is released. Never the owner id. A semaphore
        or a read-write lock answers None: no one hold keeps it busy.
        """
        key = self._description_key()
        if key is None:
            return None
        with self._reachable("inspect"):
            fields = self.client.redis.hmget(key, DESCRIPTION_FIELDS)
        return read_hold(*fields)

    @property
    def token(self) -> int | None:
        """The fencing token of the calling thread's current hold, None when it holds none.

        Tokens of one lock name strictly increase from grant to grant; re-entry
        keeps the token. Pass it to the resource you protect and have that
        resource refuse any write with a token lower than the last one it saw.
        """
        return self._token_of(self._owner())

    @property
    def lost(self) -> bool:
        """True when the calling thread's current hold on this lock was lost.

        A hold is lost when its key expired or another owner took it, as seen by
        the watchdog, by a release, or by its local deadline passing (a pause
        longer than the lease). After the lost hold is released (which raises
        LockLostError) it stays true until this thread acquires again. A new
        grant clears it at once, released or not: the thread then holds a
        fresh hold with a higher token (its newest hold is what ``lost`` and
        ``token`` speak of; releasing that one shows the lost hold below again).
        """
        current = self._current_lost(self._owner())
        if current is not None:
            return current
        local = self.__dict__.get("_thread_state")
        return local is not None and bool(getattr(local, "lost", False))

    def on_lost(self, callback: Callable[[RLock], object]) -> None:
        """Call ``callback(self)`` when a hold taken through this lock is lost.

        It runs once per lost hold, on a short-lived thread of its own.
        """
        self.lost_callbacks.append(callback)


class WaitingShellBase:
    """What every threaded waiting shell (the plain lock's, the fair lock's) shares.

    Its deadlock checks, and telling its lock whether a wake-up handed it the
    lock (:class:`HandOverSubscription`).
    """

    __slots__ = ("detector",)

    lock: RLock
    owner: str
    #: When the acquire call began (monotonic).
    started: float
    #: Made by the first deadlock check (most calls never wait that long).
    detector: Detector | None

    def check_deadlock(self) -> None:
        detector = self.detector
        if detector is None:
            detector = self.detector = self.lock._detector(self.owner, self.started)
        self.lock._check_deadlock(detector, self.started)

    def forget_edge(self) -> None:
        """Before the call returns: the owner must not run on with an edge saying it waits.

        (See ``_protocol/deadlocks.py``.)
        """
        if self.detector is not None and self.detector.written:
            self.lock._forget_edge(self.detector)

    def handed(self, subscription: Waiting) -> bool:
        """Whether the wake-up just read handed the caller the lock (taken, if so)."""
        raise NotImplementedError


class _Waiting(WaitingShellBase):
    """The sync shell of an :class:`AcquirePlan`: the script calls and the subscription."""

    __slots__ = (
        "_listening",
        "lease",
        "lock",
        "owner",
        "sent_at",
        "started",
        "subscription",
        "until",
    )

    def __init__(self, lock: RLock, owner: str, lease: float | None, plan: AcquirePlan) -> None:
        self.lock, self.owner, self.lease, self.started = lock, owner, lease, plan.started
        # A refused attempt is resent within the caller's wait; blocking=False: never.
        self.until = plan.deadline if plan.blocking else 0.0
        self.subscription: HandOverSubscription | None = None
        #: When the last attempt was sent (at the latest): a grant handed over
        #: to the caller came after it, so its deadline counts from it.
        self.sent_at = plan.started
        # The subscription's context, entered by listen (most calls never listen).
        self._listening: AbstractContextManager[Waiting] | None = None
        # Made by the first deadlock check (most calls never wait that long).
        self.detector: Detector | None = None

    def attempt(self, waiter: bool, sleep: float) -> float | None:
        subscription = self.subscription
        waiter_id = subscription.waiter_id if waiter and subscription else ""
        if waiter_id and self.lock._packs_calls and self._starving():
            sleep = -sleep  # asks the holder's release to hand it the lock (scripts.ACQUIRE)
        self.sent_at = clock.monotonic()
        return self.lock._attempt(
            self.owner, self.lease, waiter_id, sleep, requested_at=self.started, until=self.until
        )

    def _starving(self) -> bool:
        """Whether the caller was woken and lost, or has waited past :data:`STARVING_AFTER`."""
        subscription = self.subscription
        woken = subscription is not None and subscription.mark() > 0
        return woken or clock.monotonic() - self.started >= STARVING_AFTER

    def listen(self) -> None:
        listening = self.lock.client.listener.listen(self.lock.keys.channel)
        self.subscription = HandOverSubscription(self, listening.__enter__())
        self._listening = listening

    def handed(self, subscription: Waiting) -> bool:
        return self.lock._handed_over(self, subscription)

    def close(self, *, registered: bool) -> None:
        listening = self._listening
        if listening is None:
            return
        try:
            self.forget_edge()
            if registered and self.subscription is not None:
                self.lock._abandon(self.subscription.waiter_id)
            elif self.subscription is not None:
                lingers(self.subscription.inner)  # no entry left behind
        finally:
            listening.__exit__(None, None, None)


class HandOverSubscription:
    """A waiter's subscription: a wake-up that hands it the lock ends its plan.

    The plain lock's waiter is handed the lock by a release (hand-over), the
    fair lock's head by a release that grants it (handoff); its shell says
    which (:meth:`WaitingShellBase.handed`).
    """

    __slots__ = ("inner", "shell", "waiter_id")

    def __init__(self, shell: WaitingShellBase, subscription: Waiting) -> None:
        self.shell, self.inner = shell, subscription
        self.waiter_id = subscription.waiter_id

    def wait_subscribed(self, timeout: float) -> bool:
        return self.inner.wait_subscribed(timeout)

    def mark(self) -> int:
        return self.inner.mark()

    def wait(self, since: int, timeout: float) -> object:
        """As :meth:`Subscription.wait`, or :data:`HANDED` when the lock was handed to us."""
        woken = self.inner.wait(since, timeout)
        return HANDED if self.shell.handed(self.inner) else woken
