"""LockBase: the bookkeeping every kind's shells share, in both engines, without I/O.

Keys and ``with`` defaults, the hold registry's records of grants, releases and
losses, lost-reply latches and the reading of acquire replies: what
:class:`~django_rlock.core.RLock` and the asyncio ``AsyncRLock`` (and, through
them, every other kind) run the same. Each kind's own part extends it in its
``_protocol`` module (``FairBase``, ``ReadSide``/``WriteSide``, ``SemaphoreBase``,
``RedissonBase``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, ClassVar, NoReturn, Unpack, cast

from redis.exceptions import OutOfMemoryError

from django_rlock.core._process import lostholds
from django_rlock.core._process.holder import busy_reason, describe
from django_rlock.core._protocol import clock
from django_rlock.core._protocol.calls import (
    NOT_WAITING,
    NOT_WAITING_MS,
    Grant,
    ScriptCall,
    abandon_call,
    acquire_call,
    acquire_reply,
    force_release_call,
    kept_templates,
    no_lost_tail,
    release_call,
)
from django_rlock.core._protocol.holds import Hold, HoldRegistry
from django_rlock.core._protocol.layouts import RLOCK, refusal
from django_rlock.core._protocol.lock import (
    UNANSWERED,
    KindScripts,
    LockEngine,
    LockOptions,
    check_blocking,
    gave_up_after,
    handoff_min_life,
    request_id,
)
from django_rlock.core._protocol.names import (
    LockKeys,
    check_lease,
    check_max_hold,
    check_timeout,
    milliseconds,
)
from django_rlock.core._protocol.plan import AcquirePlan
from django_rlock.core._protocol.resp import Template
from django_rlock.core._protocol.unavailable import reported_unavailable
from django_rlock.core.exceptions import (
    DeadlockError,
    LockError,
    LockLostError,
    LockNotOwnedError,
    LockOutOfMemoryError,
    LockTimeout,
)

logger = logging.getLogger("django_rlock.lock")


#: Below this much of a lease hold's life left (seconds), a re-entry asks for
#: the watchdog's life instead of the rest of the lease (see _granted_lease).
_LEASE_LEFT_MIN = 0.05


#: The keywords a lock is made with (:class:`LockOptions`).
_OPTION_NAMES = frozenset(LockOptions.__annotations__)


class LockBase:
    """What :class:`RLock` and the asyncio ``AsyncRLock`` share.

    The keys and ``with`` defaults, and the bookkeeping around a release and a
    loss, which never does I/O: only the script calls differ between the two.
    ``engine`` is the client (:class:`LockEngine`) whose :class:`HoldRegistry` records
    this process's holds (an asyncio client's sync engine for ``AsyncRLock``).
    """

    #: The key layout this class speaks (:mod:`~django_rlock.core._protocol.layouts`),
    #: and the client factory that makes its kind: a lock is refused on a
    #: client of another layout, saying what that layout offers instead.
    layout: ClassVar[str] = RLOCK
    kind: ClassVar[str] = "lock"
    #: The template the name was built from (``"order:{order_id}"``), when the
    #: caller knows it (the Django face's ``@locked`` and ``rlock(template, **fields)``
    #: set it); the lock order check's class of the lock (its name when None).
    key_template: str | None = None

    def __init__(self, engine: LockEngine, name: str, **options: Unpack[LockOptions]) -> None:
        if options and not _OPTION_NAMES.issuperset(options):
            unknown = sorted(set(options) - _OPTION_NAMES)
            raise TypeError(f"unexpected keyword argument(s) for a lock: {', '.join(unknown)}")
        if engine.layout != self.layout:
            raise refusal(self.kind, self.layout, engine.layout, name)
        self._engine = engine
        self._registry: HoldRegistry = engine.holds
        self.keys = LockKeys.build(engine.key_prefix, name)
        self.timeout: float | None = None
        self.lease: float | None = None
        self.blocking = True
        self.max_hold: float | None = None
        if options:  # else the defaults, nothing to check (a view's ``with rlock(name)``)
            self.timeout = check_timeout(options.get("timeout"))
            self.lease = check_lease(options.get("lease"))
            self.blocking = check_blocking(options.get("blocking", True), self.timeout)
            self.max_hold = check_max_hold(options.get("max_hold"))
        # Seconds a waiter waits before it looks for a deadlock (None: never);
        # every kind checks, each saying what it waits for (_protocol/deadlocks.py).
        self._deadlock_timeout = engine.deadlock_timeout
        # Each is called with this very lock, so it may expect the concrete class.
        self.lost_callbacks: list[Callable[[Any], object]] = []

    @property
    def name(self) -> str:
        """The lock's name, as the caller gave it."""
        return self.keys.name

    def hold_keys(self, owner: str) -> tuple[str, str]:
        """The key that counts ``owner``'s holds, and the key renewed with it.

        A lock counts every owner's holds in its one hash. The plain lock of
        the default layout keeps its fencing token in that hash too, so the
        hash is named twice (RENEW expires it once); a sibling kind's hash is
        renewed with its fencing counter, and a sibling may count each owner's
        holds in a key of the owner's own (a semaphore's permits): the
        registry, the watchdog and the renew script work per hold on whatever
        keys this names.
        """
        keys = self.keys
        if self.kind == "lock" and self.layout == RLOCK:
            return keys.hash, keys.hash
        return keys.hash, keys.fence

    def _plan(
        self, blocking: bool, timeout: float | None, lease: float | None
    ) -> tuple[AcquirePlan, float | None]:
        """The checked arguments of one acquire call: its plan and its lease."""
        if blocking is True and timeout is None and lease is None:
            # The defaults, nothing to check (the common call: ``with lock:``).
            plan = AcquirePlan(
                blocking=True,
                wait=None,
                watchdog_timeout=self._engine.watchdog_timeout,
                deadlock_timeout=self._deadlock_timeout,
            )
            return plan, None
        wait = check_timeout(timeout)
        lease_seconds = check_lease(lease)
        check_blocking(blocking, wait)
        plan = AcquirePlan(
            blocking=blocking,
            wait=wait,
            watchdog_timeout=self._engine.watchdog_timeout,
            deadlock_timeout=self._deadlock_timeout,
        )
        return plan, lease_seconds

    def _granted_lease(self, owner: str, lease: float | None) -> float | None:
        """The lease ``owner``'s acquire call asks for: ``lease``, else this lock's own.

        A lease given to the lock (``client.lock(name, lease=4)``) applies to
        ``acquire()`` as to ``with``. And a hold taken with a lease stays one:
        re-entered with none (a helper's ``with`` inside a throttle's hold),
        the call asks for what is left of it, which the acquire script (it
        never shortens a held key) leaves as it is, so the hold is neither
        renewed nor reported leaked, and still ends with its lease.
        """
        if lease is None:
            lease = self.lease
        if lease is None:
            hold = self._registry.peek(self.hold_keys(owner)[0], owner)
            if hold is not None and not hold.watchdog and not hold.lost:
                left = hold.deadline - clock.monotonic()
                # Near its end the key may be gone when the call lands: then
                # it is a new grant, which the watchdog keeps as usual.
                if left > _LEASE_LEFT_MIN:
                    return left
        return lease

    def _gave_up(
        self, owner: str, plan: AcquirePlan, deadlock: DeadlockError | None = None
    ) -> None:
        """Tell the registry that ``owner``'s acquire call, run by ``plan``, got nothing.

        ``deadlock``: the error it raises to break a deadlock.
        """
        would_wait = plan.blocking and not plan.zero_wait
        self._registry.gave_up(self, owner, plan.started, would_wait=would_wait, deadlock=deadlock)

    def _sends_plain_calls(self) -> bool:
        """Whether this lock's acquire and release calls and hold keys are the plain lock's own."""
        kind = type(self)
        return (
            kind._acquire_call is LockBase._acquire_call
            and kind._release_call is LockBase._release_call
            and kind.hold_keys is LockBase.hold_keys
        )

    def _take_hand_over(
        self, owner: str, lease: float | None, sent_at: float, started: float, grant: bytes
    ) -> bool:
        """Record the grant a release handed ``owner``'s waiting call (RELEASE); False: none.

        ``grant`` is what the message said after the waiter's id (the token);
        ``sent_at`` when the call's last attempt was sent. The grant came after
        that attempt, which found the lock held (an attempt after the grant
        would have confirmed it), so its send time bounds the deadline from
        below. Taken only by a caller that waits with the watchdog, when that
        deadline leaves the watchdog time to renew (:func:`handoff_min_life`);
        otherwise the caller's next attempt confirms the grant (CONFIRM_HANDOFF).
        """
        if not grant or lease is not None or not grant.isdigit():
            return False
        watchdog = self._engine.watchdog_timeout
        if sent_at + watchdog - clock.monotonic() <= handoff_min_life(watchdog):
            return False
        self._registry.grant(
            self,
            owner,
            token=int(grant),
            holds=1,
            lease=None,
            sent_at=sent_at,
            pttl_ms=milliseconds(watchdog),
            requested_at=started,
        )
        return True

    def _reachable(self, action: str) -> AbstractContextManager[None]:
        """Around a public call: redis-py's connection errors become LockUnavailableError."""
        return reported_unavailable(self._engine.server, action, self.name)

    def _acquire_call(
        self, owner: str, lease: float | None, waiter_id: str, sleep: float
    ) -> ScriptCall:
        """One acquire script call (see :func:`~django_rlock.core._protocol.calls.acquire_call`)."""
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
            holder=describe(lease),
        )

    def _ttl_of(self, lease: float | None) -> float:
        """A grant's life in seconds: the fixed ``lease``, or the watchdog timeout (None)."""
        return self._engine.watchdog_timeout if lease is None else lease

    def _release_call(self, owner: str) -> ScriptCall:
        """One release script call (see :func:`~django_rlock.core._protocol.calls.release_call`)."""
        rid = self._request_id("release", owner)
        return release_call(self.keys, owner, self._engine.publish_command, rid)

    def _templates(self, owner: str, lease: float | None) -> tuple[Template, Template]:
        """The acquire (for ``lease``) and release templates of ``owner``'s calls on this lock."""
        last = self._last_templates  # one tuple read: threads sharing this object may race
        if last is not None and last[0] == owner and last[1] == lease:
            return last[2]
        made = kept_templates(self.keys, owner, self._ttl_of(lease), self._engine.publish_command)
        self._last_templates = (owner, lease, made)
        return made

    #: The last owner and lease :meth:`_templates` was asked for, and its answer:
    #: a thread's acquire and release on one lock object ask for the same.
    _last_templates: tuple[str, float | None, tuple[Template, Template]] | None = None

    def _packed_acquire(
        self, sha: str, owner: str, lease: float | None, call: ScriptCall
    ) -> bytes | None:
        """The plain lock's acquire ``call`` packed from the kept template, if it does not wait.

        The same bytes as packing ``call`` whole (:func:`~._protocol.resp.evalsha`
        with ``sha``), for the call every uncontended acquire makes (no waiter
        id, no lost holds to take off); None for any other, packed whole then.
        """
        args = call.args  # ARGV as acquire_args orders them
        if args[2] != "" or args[3] != NOT_WAITING_MS or args[5] != 0:
            return None
        template = self._templates(owner, lease)[0]
        return template.pack_fresh(sha, NOT_WAITING, call.rid, no_lost_tail(cast(str, args[7])))

    def _packed_release(self, sha: str, owner: str, call: ScriptCall) -> bytes:
        """The plain lock's release ``call`` packed from the kept template (as acquire's is)."""
        return self._templates(owner, None)[1].pack_fresh(sha, b"", call.rid, b"")

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

    def _timeout_error(
        self, remaining: float | None, holder: Mapping[str, Any] | None = None
    ) -> LockTimeout:
        """The ``with`` block's error: who holds the lock and when it may be free.

        ``holder``: what the lock's ``holder()`` read, which says whether it is
        a lease or a watchdog hold; None when unknown.
        """
        return LockTimeout(
            f"could not acquire lock {self.name!r} {gave_up_after(self.blocking, self.timeout)}: "
            + busy_reason(holder, remaining),
            name=self.name,
            retry_after=remaining,
        )

    def _description_key(self) -> str | None:
        """The hash whose ``~holder`` field describes the hold that keeps this lock busy.

        None for a kind whose busy state no single hold describes (a semaphore's
        permits, a read-write lock's readers and writer).
        """
        return self.keys.hash

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
        made it took that hold off the server first (see
        :mod:`~django_rlock.core._process.lostholds`).
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
