"""RLock: Redisson's reentrant lock, in Python.

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

import itertools
import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn, Protocol, TypedDict, TypeVar, Unpack

from redis import exceptions as redis_errors
from redis.exceptions import OutOfMemoryError

from django_rlock.core import clock, lostholds
from django_rlock.core.calls import (
    Grant,
    ScriptCall,
    abandon_call,
    acquire_call,
    acquire_reply,
    extend_call,
    force_release_call,
    hold_count_reply,
    release_call,
    ttl_reply,
)
from django_rlock.core.exceptions import (
    LockError,
    LockLostError,
    LockNotOwnedError,
    LockOutOfMemoryError,
    LockTimeout,
)
from django_rlock.core.holder import describe
from django_rlock.core.identity import thread_owner
from django_rlock.core.names import (
    LockKeys,
    check_lease,
    check_max_hold,
    check_timeout,
    milliseconds,
)
from django_rlock.core.plan import AcquirePlan, drive
from django_rlock.core.unavailable import reported_unavailable

if TYPE_CHECKING:
    import redis

    from django_rlock.core.client import LockClient
    from django_rlock.core.hold import Hold, HoldRegistry
    from django_rlock.core.waiting import Subscription

__all__ = [
    "LOST_REPLY",
    "UNANSWERED",
    "KindScripts",
    "LockBase",
    "LockOptions",
    "RLock",
    "WaitingShell",
    "check_blocking",
    "gave_up_after",
    "request_id",
    "resend_once",
]

logger = logging.getLogger("django_rlock.lock")

T = TypeVar("T")

_requests = itertools.count(1)


def request_id() -> str:
    """A new id for one acquire or release call, unique within this process.

    Latches are per owner, and owner ids are unique across processes, so a
    process-wide counter is enough (see :mod:`django_rlock.core.scripts`).
    """
    return str(next(_requests))


#: A connection that broke under a call: its reply is lost, and whether Redis
#: ran the call is unknown. A *timeout* is not resent: a resend would double
#: how long a call may hang on a partitioned or stalled server.
LOST_REPLY = (redis_errors.ConnectionError,)

#: Errors after which a call may or may not have run on the server.
UNANSWERED = (redis_errors.ConnectionError, redis_errors.TimeoutError)


def resend_once(call: Callable[[], T]) -> T:
    """Run ``call``; when its connection broke before the reply, send it once more.

    ``call`` must carry one request id for both sends: the script's request
    latch turns a resend of a call Redis already ran into a report of the
    current state, so a lost reply neither double-counts a hold nor leaves one
    that nobody renews.
    """
    try:
        return call()
    except LOST_REPLY:
        return call()


def gave_up_after(blocking: bool, timeout: float | None) -> str:
    """How long a ``with`` block that timed out tried, for its LockTimeout's message."""
    return f"within {timeout}s" if blocking else "at once (blocking=False, one attempt)"


def check_blocking(blocking: object, timeout: float | None) -> bool:
    """``blocking``: a bool, False only without a ``timeout`` (one attempt waits for nothing)."""
    if not isinstance(blocking, bool):
        raise ValueError(f"blocking must be True or False, got {blocking!r}")
    if not blocking and timeout is not None:
        raise ValueError(
            f"can't specify a timeout for a non-blocking call (blocking=False, timeout={timeout!r})"
        )
    return blocking


class LockOptions(TypedDict, total=False):
    """A lock's defaults for ``with``: the longest wait, the fixed lease, one attempt or many.

    ``max_hold`` bounds every watchdog hold taken through the lock: past that
    many seconds the watchdog stops renewing it and declares it lost.
    """

    timeout: float | None
    lease: float | None
    blocking: bool
    max_hold: float | None


class KindScripts(NamedTuple):
    """The scripts one kind of lock sends, on one engine: a row of the family's table.

    Each lock class names its row in ``_kind_scripts`` (plain, fair,
    semaphore, each side of a read-write lock; sync or asyncio): acquire,
    release, waiting and force-release are written once, in :class:`RLock`
    and ``AsyncRLock``, and send what the row says.
    """

    acquire: Callable[..., Any]
    release: Callable[..., Any]
    abandon: Callable[..., Any]
    force_release: Callable[..., Any]

    @classmethod
    def of(cls, scripts: Any) -> KindScripts:
        """The row of a script set whose four scripts bear these names (lock, semaphore)."""
        return cls(scripts.acquire, scripts.release, scripts.abandon, scripts.force_release)


class WaitingShell(Protocol):
    """The I/O shell an :class:`AcquirePlan` is driven through (see :mod:`~django_rlock.core.plan`).

    ``attempt``, ``listen`` and a ``subscription`` are what the plan calls
    (sync or awaited); ``close`` is the shell's own way out, without I/O waits.
    """

    def close(self, *, registered: bool) -> None:
        """Unsubscribe, and leave the waiting set when ``registered`` says the caller entered it."""


class LockBase:
    """What :class:`RLock` and the asyncio ``AsyncRLock`` share.

    The keys and ``with`` defaults, and the bookkeeping around a release and a
    loss, which never does I/O: only the script calls differ between the two.
    ``engine`` is the :class:`LockClient` whose :class:`HoldRegistry` records
    this process's holds (an asyncio client's sync engine for ``AsyncRLock``).
    """

    def __init__(self, engine: LockClient, name: str, **options: Unpack[LockOptions]) -> None:
        unknown = sorted(set(options) - set(LockOptions.__annotations__))
        if unknown:
            raise TypeError(f"unexpected keyword argument(s) for a lock: {', '.join(unknown)}")
        self._engine = engine
        self._registry: HoldRegistry = engine.holds
        self.keys = LockKeys.build(engine.key_prefix, name)
        self.timeout = check_timeout(options.get("timeout"))
        self.lease = check_lease(options.get("lease"))
        self.blocking = check_blocking(options.get("blocking", True), self.timeout)
        self.max_hold = check_max_hold(options.get("max_hold"))
        # Each is called with this very lock, so it may expect the concrete class.
        self.lost_callbacks: list[Callable[[Any], object]] = []

    @property
    def name(self) -> str:
        """The lock's name, as the caller gave it."""
        return self.keys.name

    def hold_keys(self, owner: str) -> tuple[str, str]:
        """The key that counts ``owner``'s holds, and the key renewed with it.

        A lock counts every owner's holds in its one hash, renewed with its
        fencing counter. A sibling may count each owner's holds in a key of the
        owner's own (a semaphore's permits): the registry, the watchdog and the
        renew script work per hold on whatever keys this names.
        """
        return self.keys.hash, self.keys.fence

    def _plan(
        self, blocking: bool, timeout: float | None, lease: float | None
    ) -> tuple[AcquirePlan, float | None]:
        """The checked arguments of one acquire call: its plan and its lease."""
        wait = check_timeout(timeout)
        lease_seconds = check_lease(lease)
        check_blocking(blocking, wait)
        watchdog = self._engine.watchdog_timeout
        return AcquirePlan(blocking=blocking, wait=wait, watchdog_timeout=watchdog), lease_seconds

    def _gave_up(self, owner: str, plan: AcquirePlan) -> None:
        """Tell the registry that ``owner``'s acquire call, run by ``plan``, got nothing."""
        would_wait = plan.blocking and not plan.zero_wait
        self._registry.gave_up(self, owner, plan.started, would_wait=would_wait)

    def _reachable(self, action: str) -> AbstractContextManager[None]:
        """Around a public call: redis-py's connection errors become LockUnavailableError."""
        return reported_unavailable(self._engine.server, action, self.name)

    def _acquire_call(
        self, owner: str, lease: float | None, waiter_id: str, sleep: float
    ) -> ScriptCall:
        """One acquire script call (see :func:`~django_rlock.core.calls.acquire_call`)."""
        rid = self._request_id("acquire", owner)
        lost = lostholds.lost_on_server(self.hold_keys(owner)[0], owner)
        return acquire_call(
            self.keys,
            owner,
            ttl=self._ttl_of(lease),
            waiter_id=waiter_id,
            sleep=sleep,
            rid=rid,
            lost=lost,
            holder=describe(),
        )

    def _ttl_of(self, lease: float | None) -> float:
        """A grant's life in seconds: the fixed ``lease``, or the watchdog timeout (None)."""
        return self._engine.watchdog_timeout if lease is None else lease

    def _release_call(self, owner: str) -> ScriptCall:
        """One release script call (see :func:`~django_rlock.core.calls.release_call`)."""
        rid = self._request_id("release", owner)
        return release_call(self.keys, owner, self._engine.publish_command, rid)

    def _abandon_call(self, waiter_id: str) -> ScriptCall:
        """One call leaving the waiting set (a sibling with its own waiters overrides it)."""
        return abandon_call(self.keys, waiter_id, self._engine.publish_command)

    def _force_release_call(self) -> ScriptCall:
        """One force-release call (a sibling with its own keys overrides it)."""
        return force_release_call(self.keys, self._engine.publish_command)

    def _kind_scripts(self) -> KindScripts:
        """The scripts this kind of lock sends on this engine (see :class:`KindScripts`)."""
        raise NotImplementedError

    def give_back_leaked(self, hold: Hold) -> None:
        """Release every hold of ``hold``'s owner, which ended holding it (each engine's own)."""
        raise NotImplementedError

    def _acquire_sender(self) -> Callable[..., Any]:
        return self._kind_scripts().acquire

    def _release_sender(self) -> Callable[..., Any]:
        return self._kind_scripts().release

    def _abandon_sender(self) -> Callable[..., Any]:
        return self._kind_scripts().abandon

    def _force_release_sender(self) -> Callable[..., Any]:
        return self._kind_scripts().force_release

    def _acquire_failed(self, error: Exception, owner: str, call: ScriptCall) -> NoReturn:
        """Raise for a failed acquire call (from its ``except``), noting an unanswered one."""
        if isinstance(error, OutOfMemoryError):
            raise self._out_of_memory_error(error) from error
        self._unanswered("acquire", owner, call.rid)
        raise error

    def _acquire_reply(
        self,
        reply: Any,
        owner: str,
        lease: float | None,
        sent_at: float,
        requested_at: float | None = None,
    ) -> float | None:
        """Record a grant (None), or the seconds to wait at most before trying again.

        ``requested_at`` is when the acquire call began (the grant's wait is
        counted from it); default ``sent_at``.
        """
        answer = acquire_reply(reply, no_expiry_wait=self._engine.watchdog_timeout)
        if isinstance(answer, Grant):
            self._registry.grant(
                self,
                owner,
                token=answer.token,
                holds=answer.holds,
                lease=lease,
                sent_at=sent_at,
                pttl_ms=answer.pttl_ms,
                requested_at=requested_at,
            )
            return None
        return answer

    def _request_id(self, kind: str, owner: str) -> str:
        """The id for the owner's next ``kind`` call: a new one, or the unanswered one.

        A call whose reply never came (a timeout, or a broken connection twice)
        may or may not have run. Its id is kept, and the owner's next call of
        the same kind on this lock reuses it: the request latch then reports
        what the first one did instead of doing it again (no double-counted
        re-entry after a retried acquire, no second release).
        """
        pending = self._registry.take_unanswered(self.hold_keys(owner)[0], owner, kind)
        return pending or request_id()

    def _unanswered(self, kind: str, owner: str, rid: str) -> None:
        self._registry.note_unanswered(self.hold_keys(owner)[0], owner, kind, rid)

    def _timeout_error(self, remaining: float | None) -> LockTimeout:
        return LockTimeout(
            f"could not acquire lock {self.name!r} {gave_up_after(self.blocking, self.timeout)}"
            + ("" if remaining is None else f" (the holder's lease ends in {remaining:.3f}s)"),
            name=self.name,
            retry_after=remaining,
        )

    def _out_of_memory_error(self, error: OutOfMemoryError) -> LockOutOfMemoryError:
        return LockOutOfMemoryError(
            f"cannot acquire lock {self.name!r}: Redis is out of memory (OOM: maxmemory "
            f"reached and nothing may be evicted), so it refuses new grants: {error}",
            name=self.name,
        )

    def _lost_error(self) -> LockLostError:
        return LockLostError(
            f"lock {self.name!r} was lost: it expired or another owner took it before release",
            name=self.name,
        )

    def _extend_prepare(self, owner: str, seconds: object, owner_kind: str) -> Hold:
        """Before extend's call: the owner's fixed-lease hold, or the error to raise."""
        lease = check_lease(seconds)
        if lease is None:
            raise ValueError("extend() needs the seconds the lease should still run, not None")
        hold = self._registry.newest(self.hold_keys(owner)[0], owner)
        if hold is None:
            raise LockNotOwnedError(
                f"cannot extend lock {self.name!r}: the calling {owner_kind} does not hold it",
                name=self.name,
            )
        if self._holds_lost(owner):
            raise self._lost_error()
        if hold.watchdog:
            raise LockError(
                f"cannot extend lock {self.name!r}: the watchdog renews it (it was taken "
                "without a lease), so it has no fixed lease to move; acquire it with "
                "lease=... to extend it by hand"
            )
        return hold

    def _extend_settle(self, hold: Hold, sent_at: float, reply: Any) -> None:
        """After extend's call answered: the new deadline, or the hold is lost."""
        pttl_ms = int(reply[0])
        if pttl_ms <= 0:
            self._registry.declare_lost(hold, "it expired before extend()", by_owner=True)
            raise self._lost_error()
        # Set anew, not extended: a shorter lease is what the caller asked for.
        self._registry.set_deadline(hold, sent_at, pttl_ms)

    def _extend_failed(self, hold: Hold, sent_at: float, seconds: float) -> None:
        """Extend's call failed, outcome unknown: never believe the key lives longer than asked.

        The call may have shortened the key; the deadline drops to what it set.
        """
        if hold.deadline > sent_at + seconds:
            self._registry.set_deadline(hold, sent_at, milliseconds(seconds))

    def _release_prepare(self, owner: str, remember_lost: Callable[[], None]) -> Hold | None:
        """Before the release script: the owner's newest hold (None: it has none here).

        A hold already known lost is acknowledged instead (no script is sent):
        LockLostError is raised, and ``remember_lost`` called once its last
        hold is acknowledged.
        """
        hold = self._registry.start_release(self.hold_keys(owner)[0], owner)
        if hold is not None and hold.lost:
            self._acknowledge_lost(hold, remember_lost)
            raise self._lost_error()
        return hold

    def _release_settle(
        self, hold: Hold | None, left: int, owner_kind: str, remember_lost: Callable[[], None]
    ) -> None:
        """After the release script answered ``left`` (-1: the owner held nothing)."""
        registry = self._registry
        if left < 0:
            if hold is None:
                raise LockNotOwnedError(
                    f"cannot release lock {self.name!r}: the calling {owner_kind} does not hold it",
                    name=self.name,
                )
            registry.declare_lost(
                hold, "it expired or was taken over before release", by_owner=True
            )
            self._acknowledge_lost(hold, remember_lost)
            raise self._lost_error()
        if hold is None:
            return  # a hold of the same owner taken through another client
        registry.released(hold, left)

    def _release_failed(
        self, hold: Hold | None, error: BaseException, owner: str, call: ScriptCall
    ) -> None:
        """The release script failed (Redis unreachable, reply lost...).

        Whether Redis applied it is unknown, so the hold is not kept alive: its
        local count drops as if released and, at zero, the watchdog stops
        renewing it, so the key expires within its lease or the watchdog
        timeout. Retrying the release is safe: a second one that finds nothing
        to release raises LockNotOwnedError and changes nothing.

        Only a release that left no hold here keeps its request id for the
        owner's next release, which can only be its retry. With holds left,
        this one counts as done and the next release is one of its own: reusing
        the id would have the latch report this one instead of applying it.
        """
        dropped = hold is None or self._registry.release_failed(hold)
        if dropped and isinstance(error, UNANSWERED):
            self._unanswered("release", owner, call.rid)
        if hold is None or not dropped:
            return
        logger.warning(
            "releasing lock %r failed (%s): it will expire by itself within %s",
            self.name,
            type(error).__name__,
            f"{self._engine.watchdog_timeout:g}s" if hold.watchdog else "its lease",
        )

    def _acknowledge_lost(self, hold: Hold, remember_lost: Callable[[], None]) -> None:
        # One hold of a lost lock is given up; at the last, the loss is remembered.
        if self._registry.acknowledge_lost(hold):
            remember_lost()

    def _token_of(self, owner: str) -> int | None:
        hold = self._registry.newest(self.hold_keys(owner)[0], owner)
        return None if hold is None else hold.token

    def _holds_lost(self, owner: str) -> bool:
        """Whether ``owner``'s current hold is lost, declaring those whose deadline passed.

        The current hold is the newest. A fresh grant after a loss is a new
        term: it is not lost, even while the lost hold below it still waits
        for its owner's release (which raises LockLostError); the acquire that
        made it took that hold off the server first (see :mod:`~django_rlock.core.lostholds`).
        """
        return self._current_lost(owner) is True

    def _current_lost(self, owner: str) -> bool | None:
        """Whether ``owner``'s newest hold is lost; None when it has no hold here."""
        registry = self._registry
        stack = registry.holds_of(self.hold_keys(owner)[0], owner)
        now = clock.monotonic()
        for hold in stack:
            if not hold.lost and now >= hold.deadline:
                registry.declare_lost(hold, "its deadline passed without a renewal")
        return stack[-1].lost if stack else None


class RLock(LockBase):
    """A reentrant distributed lock; get one from :meth:`LockClient.lock`."""

    def __init__(self, client: LockClient, name: str, **options: Unpack[LockOptions]) -> None:
        super().__init__(client, name, **options)
        self.client = client
        # Per thread: whether this thread's last hold through this object ended lost.
        self._local = threading.local()

    def __repr__(self) -> str:
        return f"<RLock {self.name!r}>"

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
        with self._reachable("acquire"):
            return self._acquire_waiting(plan, lease_seconds)

    def _acquire_waiting(self, plan: AcquirePlan, lease_seconds: float | None) -> bool:
        owner = thread_owner()
        shell = self._waiting_shell(owner, lease_seconds, plan)
        try:
            granted = drive(plan, shell)
        finally:
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
    ) -> float | None:
        """One acquire script call: None when granted, else seconds to wait at most.

        A ``waiter_id`` enters the caller in the lock's waiting set, so that a
        release can wake it alone; ``sleep`` is how long it will wait at most.
        ``via`` is another connection to the same server to send it on (RedLock
        uses one with a short timeout); ``requested_at`` is when the caller's
        acquire began.
        """
        call = self._acquire_call(owner, lease, waiter_id, sleep)
        send_acquire = self._acquire_sender()
        sent_at = clock.monotonic()
        try:
            if via is not None:
                # RedLock bounds each server to one short attempt: no resend.
                reply = send_acquire(keys=call.keys, args=call.args, client=via)
            else:
                held = self.client.held()
                try:
                    reply = send_acquire(keys=call.keys, args=call.args, client=held)
                except LOST_REPLY:  # see resend_once: same call, same request id
                    reply = send_acquire(keys=call.keys, args=call.args, client=held)
        except (OutOfMemoryError, *UNANSWERED) as error:
            self._acquire_failed(error, owner, call)
        wait = self._acquire_reply(reply, owner, lease, sent_at, requested_at)
        if wait is None:
            self._local.lost = False
        return wait

    def _kind_scripts(self) -> KindScripts:
        scripts = self.client.scripts
        # Acquire alone may wait for replicas (min_replicas): the client's sender knows.
        return KindScripts(
            self.client.send_acquire, scripts.release, scripts.abandon, scripts.force_release
        )

    def _waiting_shell(self, owner: str, lease: float | None, plan: AcquirePlan) -> WaitingShell:
        """The shell that runs ``plan``'s calls for ``owner`` (a sibling may queue its own)."""
        return _Waiting(self, owner, lease, plan.started)

    def attempt_as(self, owner: str, lease: float | None, *, via: redis.Redis | None) -> bool:
        """One acquire call for ``owner``, no waiting: True when granted.

        For lock groups (:class:`~django_rlock.core.multilock.RedLock`), which
        try each member once on its own short-timeout connection ``via``.
        Raises what the call raised: the group decides what an error means.
        """
        return self._attempt(owner, lease, via=via) is None

    def _abandon(self, waiter_id: str) -> None:
        """Leave the waiting set without the lock, passing on a wake-up meant for us."""
        call = self._abandon_call(waiter_id)
        try:
            self._abandon_sender()(keys=call.keys, args=call.args)
        except Exception:
            logger.debug("could not leave the waiting set of %r", self.name, exc_info=True)

    def __enter__(self) -> RLock:
        if not self.acquire(self.blocking, self.timeout, self.lease):
            raise self._timeout_error(self.ttl())
        return self

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
        self._release_owned(thread_owner())

    def _release_owned(self, owner: str) -> None:
        """Give back one hold of ``owner`` (the calling thread, or a leaked hold's owner)."""
        client = self.client
        hold = self._release_prepare(owner, self._remember_lost)
        call = self._release_call(owner)
        with self._reachable("release"):
            try:
                release = self._release_sender()
                held = client.held()
                try:
                    left = int(release(keys=call.keys, args=call.args, client=held))
                except LOST_REPLY:  # see resend_once: same call, same request id
                    left = int(release(keys=call.keys, args=call.args, client=held))
            except BaseException as error:
                self._release_failed(hold, error, owner, call)
                raise
        self._release_settle(hold, left, "thread", self._remember_lost)

    def _remember_lost(self) -> None:
        self._local.lost = True

    def give_back_leaked(self, hold: Hold) -> None:
        """Release every hold of a leaked ``hold``'s owner (see :mod:`~django_rlock.core.leaks`)."""
        for _ in range(hold.count):
            self._release_owned(hold.owner)

    def extend(self, seconds: float) -> None:
        """The calling thread's fixed lease now ends ``seconds`` from now (longer or shorter).

        Raises :class:`LockNotOwnedError` when the thread holds nothing,
        :class:`LockLostError` when its hold was lost, and :class:`LockError`
        for a hold the watchdog renews (it has no fixed lease to move).
        """
        owner = thread_owner()
        hold = self._extend_prepare(owner, seconds, "thread")
        call = extend_call(*self.hold_keys(owner), owner, seconds)
        sent_at = clock.monotonic()
        with self._reachable("extend"):
            try:
                reply = self.client.scripts.renew(keys=call.keys, args=call.args)
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
            return bool(self.client.redis.hexists(self.keys.hash, thread_owner()))

    def hold_count(self) -> int:
        """How many holds the calling thread has on the lock (0 when none; asks Redis)."""
        with self._reachable("inspect"):
            return hold_count_reply(self.client.redis.hget(self.keys.hash, thread_owner()))

    def ttl(self) -> float | None:
        """Seconds until the lock expires, None when nobody holds it (inf: no expiry)."""
        with self._reachable("inspect"):
            return ttl_reply(self.client.redis.pttl(self.keys.hash))

    @property
    def token(self) -> int | None:
        """The fencing token of the calling thread's current hold, None when it holds none.

        Tokens of one lock name strictly increase from grant to grant; re-entry
        keeps the token. Pass it to the resource you protect and have that
        resource refuse any write with a token lower than the last one it saw.
        """
        return self._token_of(thread_owner())

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
        current = self._current_lost(thread_owner())
        if current is not None:
            return current
        return bool(getattr(self._local, "lost", False))

    def on_lost(self, callback: Callable[[RLock], object]) -> None:
        """Call ``callback(self)`` when a hold taken through this lock is lost.

        It runs once per lost hold, on a short-lived thread of its own.
        """
        self.lost_callbacks.append(callback)


class _Waiting:
    """The sync shell of an :class:`AcquirePlan`: the script calls and the subscription."""

    def __init__(self, lock: RLock, owner: str, lease: float | None, started: float) -> None:
        self.lock, self.owner, self.lease, self.started = lock, owner, lease, started
        self.subscription: Subscription | None = None
        self._stack = ExitStack()

    def attempt(self, waiter: bool, sleep: float) -> float | None:
        waiter_id = self.subscription.waiter_id if waiter and self.subscription else ""
        return self.lock._attempt(
            self.owner, self.lease, waiter_id, sleep, requested_at=self.started
        )

    def listen(self) -> None:
        listener = self.lock.client.listener
        self.subscription = self._stack.enter_context(listener.listen(self.lock.keys.channel))

    def close(self, *, registered: bool) -> None:
        with self._stack:
            if registered and self.subscription is not None:
                self.lock._abandon(self.subscription.waiter_id)
