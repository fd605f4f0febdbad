"""The local record of one owner's hold on one lock.

Redis is the source of truth for who holds a lock; a :class:`Hold` is what this
process knows about its own hold: the hold count, the fencing token, how long
the key is known to live, and whether the hold was lost. Holds live in a
:class:`HoldRegistry` (one per client), keyed by ``(lock key, owner)``, so
that every lock object naming the same lock in one thread shares them (as
Redis does); the registry is the only code that changes them, and tells
subscribers when a hold is acquired, released or lost.

One rule ties a hold's local deadline to its key's expiry, on every path that
sets or extends it (a grant, a re-entry, a renewal, a retry the request latch
reports): each such script replies with the key's PTTL after the call, and the
deadline is the call's *send* time plus that PTTL, less Redlock's allowance
for clock drift (:func:`key_deadline`). The server ran the call after it was
sent, so the deadline never falls after the key's real expiry, whichever
branch the script took and however late the reply came, as long as the
server's clock and this process's agree within that allowance. No script
shortens a held key's life (but MultiLock's re-expiry of a grant it has just
made, which then sets the deadline anew), so a later reply can only move a
deadline later (:meth:`Hold.extend`).
"""

from __future__ import annotations

import logging
import math
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from django_rlock.core._process import forking, leaks, lostholds, scopes, telling
from django_rlock.core._protocol import clock
from django_rlock.core._protocol.names import LockKeys
from django_rlock.core.exceptions import DeadlockError

logger = logging.getLogger("django_rlock.lock")


T = TypeVar("T")


class HeldLock(Protocol):
    """What the registry needs of a lock it records holds through (every kind has it)."""

    keys: LockKeys
    max_hold: float | None
    #: The template the name was built from, if known (the lock order check's class).
    key_template: str | None
    lost_callbacks: list[Callable[[Any], object]]

    def hold_keys(self, owner: str) -> tuple[str, str]:
        """The key that counts ``owner``'s holds, and the key renewed with it."""
        ...

    def give_back_leaked(self, hold: Hold) -> None:
        """Release every hold of ``hold``'s owner, whose thread or task is gone."""
        ...


def key_deadline(sent_at: float, pttl_ms: int) -> float:
    """The local monotonic moment a key may expire, from a reply about it.

    ``sent_at`` is when the call was sent, ``pttl_ms`` the key's PTTL the
    script reported after running it, less the clock drift Redlock allows
    (:func:`~django_rlock.core._protocol.clock.drift`: Redis counts the PTTL on its own
    clock). A key with no expiry (-1, only ever set by hand) never expires by
    itself.
    """
    if pttl_ms < 0:
        return math.inf
    left = pttl_ms / 1000
    return sent_at + left - clock.drift(left)


@dataclass(eq=False)
class Hold:
    """One owner's hold on one lock, as this process knows it.

    ``deadline`` is monotonic: the moment the key may have expired, counted
    from when the call that last set its expiry was *sent* (so it is never
    later than the server's own expiry; see :func:`key_deadline`).
    ``releasing`` is set while the owner's final release is on the wire, so a
    renewal racing it does not call it lost.
    """

    name: str
    key: str
    #: The key renewals give the lock's expiry too: a sibling kind's fencing counter
    #: (the plain lock keeps its token in its hash, and names the hash again).
    fence: str
    owner: str
    token: int
    count: int
    watchdog: bool
    deadline: float
    acquired_at: float
    #: Seconds the acquire call that got this hold waited for it.
    waited: float = 0.0
    #: Seconds after ``acquired_at`` past which the watchdog stops renewing
    #: the hold and declares it lost; None: no bound.
    max_hold: float | None = None
    locks: list[HeldLock] = field(default_factory=list)
    lost: bool = False
    releasing: bool = False
    released: bool = False
    #: Its owner (a thread or task) ended, or its request finished, still holding it.
    leaked: bool = False
    #: The unit of work (request, task run) under way when it was granted, if
    #: any: it ends with that unit (:mod:`~django_rlock.core._process.scopes`).
    scope: scopes.Scope | None = None
    #: Where the code that took it is (``path:line in function``), for the
    #: slow-hold and leak reports; noted by whoever reports it (the Django
    #: face's reporter), None otherwise.
    location: str | None = None

    def add_lock(self, lock: HeldLock) -> None:
        """Remember that ``lock`` took this hold, so its ``on_lost`` callbacks run on loss."""
        if all(existing is not lock for existing in self.locks):
            self.locks.append(lock)

    def extend(self, sent_at: float, pttl_ms: int) -> None:
        """Take in a reply that found the key alive, ``pttl_ms`` left (see :func:`key_deadline`).

        Never moves the deadline earlier: no script shortens a held key, so
        of two replies (a renewal and a re-entry racing it) the later
        deadline is the true one, whichever reply arrived last.
        """
        self.deadline = max(self.deadline, key_deadline(sent_at, pttl_ms))


#: Called with the hold an event is about (see :class:`HoldRegistry`).
HoldCallback = Callable[[Hold], object]


@dataclass(frozen=True)
class GaveUp:
    """An acquire call that ended without the lock: its wait ran out, or one attempt failed."""

    name: str
    key: str
    owner: str
    #: The lock object the call was made on.
    lock: HeldLock
    #: Seconds the call waited before giving up.
    waited: float
    #: False when the call made one attempt only (``blocking=False`` or a zero
    #: timeout): the lock was busy. True when a wait for it ran out.
    would_wait: bool = True
    #: The error when the call gave up to break a deadlock (its ``cycle`` names
    #: every lock and holder), else None.
    deadlock: DeadlockError | None = None


#: Called with an acquire call that gave up (see :meth:`HoldRegistry.on_gave_up`).
GaveUpCallback = Callable[[GaveUp], object]


#: A lost hold's callbacks: each one and what it is called with.
class HoldRegistry:
    """The holds of this process on one Redis deployment, and the events they go through.

    One registry per :class:`~django_rlock.core.LockClient`, shared by every
    lock made through it (and by its asyncio twin). Holds are kept per
    ``(lock key, owner)``, newest last. Besides the live holds it keeps, per
    key and owner, the ids of calls whose reply never came
    (:meth:`take_unanswered`). Thread-safe: one mutex of its own, never held
    while a callback or a watchdog call runs.

    Events, for whoever subscribes (callbacks run in the order subscribed; one
    that raises is logged and the others still run):

    - :meth:`on_acquired`: a new hold was granted (not a re-entry), on the
      acquiring thread;
    - :meth:`on_released`: an owner's last hold was given back (or dropped
      after a release whose outcome is unknown), on the releasing thread;
    - :meth:`on_lost`: a hold was lost, on a short-lived thread of its own
      after the callbacks of the locks that took it, so a slow callback cannot
      delay the renewal of other locks; the owner's giving it back later is an
      :meth:`on_released` event with ``hold.lost`` set;
    - :meth:`on_gave_up`: an acquire call ended without the lock, on the
      calling thread;
    - :meth:`on_leaked`: a hold outlived its owner (a thread that ended, a task
      that is done) or the request that took it (:meth:`report_leaked`), on
      whichever thread noticed.

    ``watch`` is called (outside the mutex) when the first hold the watchdog
    must renew is granted, and again after :meth:`abandon_watched`.
    """

    def __init__(self, watch: Callable[[], object] = lambda: None) -> None:
        self._watch = watch
        #: Give back a leaked hold on the server (True), or only report it and
        #: let it expire (see :mod:`django_rlock.core._process.leaks`).
        self.release_leaked = True
        self._lock = threading.Lock()
        self._holds: dict[tuple[str, str], list[Hold]] = {}
        # Owner -> the lock keys it has holds on here, in the order taken (a dict
        # as an ordered set): holds_owned_by reads an owner's holds without a
        # scan of every hold of the process (it runs as each request ends).
        self._keys_of: dict[str, dict[str, None]] = {}
        # (lock key, owner, "acquire"/"release") -> the request id of a call whose
        # reply never came: the owner's next such call reuses it (see LockBase).
        self._unanswered: dict[tuple[str, str, str], str] = {}
        self._watched = False  # `watch` was called for the holds now kept
        self._acquired: list[HoldCallback] = []
        self._released: list[HoldCallback] = []
        self._lost: list[HoldCallback] = []
        self._gave_up: list[GaveUpCallback] = []
        self._leaked: list[Callable[[Hold, str], object]] = []
        _registries.add(self)

    # -- events ---------------------------------------------------------------------

    def on_acquired(self, callback: HoldCallback) -> None:
        """Call ``callback(hold)`` for every new hold granted from now on."""
        self._acquired.append(callback)

    def on_released(self, callback: HoldCallback) -> None:
        """Call ``callback(hold)`` whenever an owner's last hold on a lock is given back."""
        self._released.append(callback)

    def on_lost(self, callback: HoldCallback) -> None:
        """Call ``callback(hold)`` whenever a hold is lost (on a thread of its own)."""
        self._lost.append(callback)

    def on_gave_up(self, callback: GaveUpCallback) -> None:
        """Call ``callback(gave_up)`` whenever an acquire call ends without the lock."""
        self._gave_up.append(callback)

    def on_leaked(self, callback: Callable[[Hold, str], object]) -> None:
        """Call ``callback(hold, reason)`` whenever a hold is found leaked (once per hold)."""
        self._leaked.append(callback)

    def unsubscribe(self, *callbacks: Callable[..., object]) -> None:
        """Stop calling ``callbacks`` for any event they were subscribed to."""
        self._acquired[:] = [known for known in self._acquired if known not in callbacks]
        self._released[:] = [known for known in self._released if known not in callbacks]
        self._lost[:] = [known for known in self._lost if known not in callbacks]
        self._gave_up[:] = [known for known in self._gave_up if known not in callbacks]
        self._leaked[:] = [known for known in self._leaked if known not in callbacks]

    # -- reading --------------------------------------------------------------------

    def holds_of(self, key: str, owner: str) -> list[Hold]:
        """A copy of ``owner``'s holds on the lock keyed ``key``, newest last."""
        with self._lock:
            return list(self._holds.get((key, owner), []))

    def peek(self, key: str, owner: str) -> Hold | None:
        """:meth:`newest`, without the mutex: for the owner's own calls, on its hot path.

        Only the owner adds holds of its own, and reading a dict entry and a
        list's last item is atomic in CPython, so the owner reads a hold it has.
        Another thread may mark it lost or released meanwhile, as after any read.
        """
        stack = self._holds.get((key, owner))
        return stack[-1] if stack else None

    def newest(self, key: str, owner: str) -> Hold | None:
        """``owner``'s newest hold on the lock keyed ``key``, None when it has none."""
        with self._lock:
            stack = self._holds.get((key, owner))
            return stack[-1] if stack else None

    def watched_holds(self) -> list[Hold]:
        """The holds the watchdog renews now: watchdog holds not released, lost or leaked."""
        with self._lock:
            return [
                hold
                for stack in self._holds.values()
                for hold in stack
                if hold.watchdog and not hold.lost and not hold.released and not hold.leaked
            ]

    def holds_owned_by(self, owner: str) -> list[Hold]:
        """Every live hold of ``owner`` (neither released nor lost), oldest first."""
        with self._lock:
            return [
                hold
                for key in self._keys_of.get(owner, ())
                for hold in self._holds[(key, owner)]
                if not hold.lost and not hold.released
            ]

    def forget_holds(self, holds: list[Hold]) -> None:
        """Stop keeping ``holds`` (of this registry or not): nobody can release them any more.

        Each is a hold a unit of work left to a thread that now goes on under a
        new owner id: a lease hold running to its lease's end, or a leaked one
        left to expire (``release_leaked`` false); neither is renewed. The
        server ends them; this registry stops keeping them, which would
        otherwise grow with every request that leaves a lease behind.
        """
        with self._lock:
            for hold in holds:
                self._drop(hold)

    def owns_any(self, owner: str) -> bool:
        """Whether this registry keeps any hold of ``owner`` (lost ones too)."""
        with self._lock:
            return bool(self._keys_of.get(owner))

    def keeps(self, hold: Hold) -> bool:
        """Whether ``hold`` is one of this registry's live holds."""
        with self._lock:
            stack = self._holds.get((hold.key, hold.owner))
            return stack is not None and hold in stack

    def report_leaked(self, hold: Hold, reason: str) -> bool:
        """Mark ``hold`` leaked and tell the :meth:`on_leaked` subscribers; False if not done.

        From now on the watchdog no longer renews it. Giving it back is the
        caller's choice (:mod:`django_rlock.core._process.leaks`). Only a watchdog hold
        can leak: one taken with a ``lease`` ends with it by design (a caller
        may take one and leave it, to do something at most once per lease), so
        False for it, as for a hold already reported, lost or released.
        """
        with self._lock:
            if hold.leaked or hold.lost or hold.released or not hold.watchdog:
                return False
            hold.leaked = True
        if not self._leaked:
            logger.warning("lock %r leaked: %s", hold.name, reason)
        for callback in list(self._leaked):
            try:
                callback(hold, reason)
            except Exception:
                logger.exception("hold event callback %r failed", callback)
        return True

    # -- request ids of calls that were never answered ----------------------------

    def take_unanswered(self, key: str, owner: str, kind: str) -> str | None:
        """The id of ``owner``'s unanswered ``kind`` call on ``key``, forgotten as it is taken."""
        if not self._unanswered:
            # Almost always: no mutex. Only the owner's own thread notes its calls.
            return None
        with self._lock:
            return self._unanswered.pop((key, owner, kind), None)

    def note_unanswered(self, key: str, owner: str, kind: str, rid: str) -> None:
        """Remember that ``owner``'s ``kind`` call ``rid`` on ``key`` got no reply."""
        with self._lock:
            self._unanswered[(key, owner, kind)] = rid

    # -- grants and deadlines -------------------------------------------------------

    def grant(
        self,
        lock: HeldLock,
        owner: str,
        *,
        token: int,
        holds: int,
        lease: float | None,
        sent_at: float,
        pttl_ms: int,
        requested_at: float | None = None,
    ) -> Hold:
        """Record a grant Redis has just made to ``owner`` through ``lock``.

        ``holds`` is the owner's hold count the server reported: above one it
        re-enters the newest live hold. ``sent_at`` is when the acquire call
        was sent and ``pttl_ms`` the key's life left that its reply reported
        (see :func:`key_deadline`). ``requested_at`` is when the caller began
        to ask (before any wait; default ``sent_at``).
        """
        name = lock.keys.name
        key, fence = lock.hold_keys(owner)
        stale: Hold | None = None
        new = False
        with self._lock:
            # This grant's call took the lost holds off the server (scripts.ACQUIRE).
            lostholds.forget(key, owner)
            stack = self._holds.get((key, owner))
            if stack is None:
                stack = self._holds[(key, owner)] = []
                self._keys_of.setdefault(owner, {})[key] = None
            top = stack[-1] if stack else None
            if top is not None and not top.lost and holds > 1:
                top.count += 1
                top.extend(sent_at, pttl_ms)
                hold = top
                # A re-entry keeps the hold's kind: a lease hold is never turned
                # into one the watchdog renews (LockBase._granted_lease asks
                # for the rest of its lease; near its end the key may live a
                # little longer than the lease, never renewed).
                # The tightest bound of any entry holds, counted from the first grant.
                if lock.max_hold is not None:
                    hold.max_hold = min(hold.max_hold or lock.max_hold, lock.max_hold)
            else:
                if top is not None and not top.lost:
                    # We believed we held it, yet Redis granted afresh: the old
                    # hold expired unnoticed (a long pause). Report it now.
                    stale = top
                hold = Hold(
                    name=name,
                    key=key,
                    fence=fence,
                    owner=owner,
                    token=token,
                    count=1,
                    watchdog=lease is None,
                    deadline=key_deadline(sent_at, pttl_ms),
                    acquired_at=sent_at,
                    waited=clock.monotonic() - (sent_at if requested_at is None else requested_at),
                    max_hold=lock.max_hold,
                    locks=[lock],
                )
                stack.append(hold)
                new = True
                scope = scopes.current()
                if scope is not None:
                    hold.scope = scope
                    scope.holds[hold] = None
            start_watch = hold.watchdog and not self._watched
            self._watched = self._watched or hold.watchdog
        if stale is not None:
            self.declare_lost(stale, "it expired before this re-entry")
        if start_watch:
            self._watch()
        if new and self._acquired:
            _notify(self._acquired, hold)
        return hold

    def extend(self, hold: Hold, sent_at: float, pttl_ms: int) -> None:
        """Take in a reply that found ``hold``'s key alive (see :meth:`Hold.extend`)."""
        with self._lock:
            hold.extend(sent_at, pttl_ms)

    def set_deadline(self, hold: Hold, sent_at: float, pttl_ms: int) -> None:
        """Set ``hold``'s deadline anew from a call that shortened its key on purpose."""
        with self._lock:
            hold.deadline = key_deadline(sent_at, pttl_ms)

    # -- releases -------------------------------------------------------------------

    def start_release(self, key: str, owner: str) -> Hold | None:
        """Before a release call: ``owner``'s newest hold on ``key`` (None: it has none).

        A last hold is marked ``releasing``, so a renewal racing the release
        does not call it lost. A hold already lost is returned as it is: its
        owner acknowledges it (:meth:`acknowledge_lost`) instead of calling.
        """
        with self._lock:
            stack = self._holds.get((key, owner))
            hold = stack[-1] if stack else None
            if hold is not None and not hold.lost and hold.count == 1:
                hold.releasing = True
            return hold

    def released(self, hold: Hold, left: int) -> None:
        """A release call of ``hold``'s owner answered: ``left`` holds remain on the server.

        Holds left when ``hold`` has none are holds the server counts and this
        client does not (a re-entry whose reply never came): they are left to
        expire, and the owner's next acquire takes them off (:meth:`_left_on_server`).
        """
        with self._lock:
            hold.count -= 1
            done = hold.count <= 0 or left == 0
            if done:
                self._forget(hold)
        if done and left > 0:
            self._left_on_server(hold, left)
        if done and self._released:
            _notify(self._released, hold)

    def release_failed(self, hold: Hold) -> bool:
        """A release call of ``hold`` failed, outcome unknown: count it as released.

        At zero the hold is dropped, so the watchdog stops renewing it and the
        key expires by itself; as the release may not have run, the owner's next
        acquire takes the hold off first (:meth:`_left_on_server`). True when it
        was dropped.
        """
        return self._give_up_one(hold, release_ended=True)

    def acknowledge_lost(self, hold: Hold) -> bool:
        """The owner gives up one hold of a lost lock; True when that was its last."""
        return self._give_up_one(hold)

    def _give_up_one(self, hold: Hold, *, release_ended: bool = False) -> bool:
        # One hold given back without a release reply: at the last, it is released.
        with self._lock:
            if release_ended:
                hold.releasing = False
            hold.count -= 1
            if hold.count > 0:
                return False
            self._forget(hold)
        if release_ended:
            self._left_on_server(hold, 1)
        _notify(self._released, hold)
        return True

    def _left_on_server(self, hold: Hold, holds: int) -> None:
        # ``hold`` is given back, yet the server may still count ``holds`` holds of
        # its owner. Left there, the owner's next acquire would re-enter them: the
        # old token handed out as a new grant, and a hold count above the client's,
        # so the lock would outlive the owner's release. They are recorded as lost
        # instead, so that acquire takes them off first and grants anew (lostholds),
        # unless a live hold of another client of this process is still theirs: the
        # owner (a thread or task, whichever client it uses) may hold through two.
        others = [registry for registry in list(_registries) if registry is not self]
        if any(registry._holds_live(hold.key, hold.owner, hold.token) for registry in others):
            return
        lostholds.record(hold.key, hold.owner, hold.token, holds)

    def _holds_live(self, key: str, owner: str, token: int) -> bool:
        # Whether this registry has a hold of ``owner`` on ``key`` from grant ``token``
        # that is neither lost, nor given back, nor past its deadline.
        now = clock.monotonic()
        with self._lock:
            return any(
                hold.token == token and not hold.lost and not hold.released and now < hold.deadline
                for hold in self._holds.get((key, owner), [])
            )

    def gave_up(
        self,
        lock: HeldLock,
        owner: str,
        requested_at: float,
        *,
        would_wait: bool = True,
        deadlock: DeadlockError | None = None,
    ) -> None:
        """An acquire call of ``owner`` on ``lock``, begun at ``requested_at``, got nothing.

        ``would_wait`` is False for a call that made one attempt only;
        ``deadlock`` the error of a call that gave up to break a deadlock (see
        :class:`GaveUp`).
        """
        if not self._gave_up:
            return
        keys = lock.keys
        event = GaveUp(
            name=keys.name,
            key=keys.hash,
            owner=owner,
            lock=lock,
            waited=clock.monotonic() - requested_at,
            would_wait=would_wait,
            deadlock=deadlock,
        )
        _notify(self._gave_up, event)

    def _forget(self, hold: Hold) -> None:
        # Called with the mutex held: the hold is fully given back.
        hold.released = True
        self._drop(hold)

    def _drop(self, hold: Hold) -> None:
        # Called with the mutex held: the registry (and its scope) stops keeping it.
        if hold.scope is not None:
            hold.scope.holds.pop(hold, None)
        stack = self._holds.get((hold.key, hold.owner))
        if stack is not None and hold in stack:
            stack.remove(hold)
            if not stack:
                del self._holds[(hold.key, hold.owner)]
                keys = self._keys_of[hold.owner]
                keys.pop(hold.key, None)
                if not keys:
                    del self._keys_of[hold.owner]

    # -- losses ---------------------------------------------------------------------

    def declare_lost(self, hold: Hold, reason: str, *, by_owner: bool = False) -> None:
        """Mark ``hold`` lost (once), stop renewing it, and run its callbacks.

        A renewal that races the owner's own final release is not a loss, so
        unless ``by_owner`` a hold being released is left to the release path.
        """
        with self._lock:
            if hold.lost or hold.released or (hold.releasing and not by_owner):
                return
            hold.lost = True
            locks = list(hold.locks)
            # The server may still count these holds: the owner's next acquire,
            # through any client of the process, takes them off first (lostholds).
            # Not so for a hold a newer grant has replaced (the server granted
            # afresh: it had let this one expire): the record would then name the
            # newer grant, and a read or a permit carries no token to tell the two
            # apart, so the owner's next call would take off its own live hold.
            stack = self._holds.get((hold.key, hold.owner), [])
            if not stack or stack[-1] is hold:
                lostholds.record(hold.key, hold.owner, hold.token, hold.count)
        logger.warning("lock %r lost: %s", hold.name, reason)
        calls: telling.Calls = [
            (callback, lock) for lock in locks for callback in lock.lost_callbacks
        ]
        calls += [(callback, hold) for callback in self._lost]
        telling.tell(calls)

    def abandon_watched(self, reason: str) -> None:
        """Declare every hold the watchdog renews lost: nothing will renew them any more.

        Also forgets the unanswered calls; a later watchdog hold calls ``watch`` again.
        """
        orphans = self.watched_holds()
        with self._lock:
            self._unanswered.clear()
            self._watched = False
        for hold in orphans:
            self.declare_lost(hold, reason)

    def forget_all(self) -> None:
        """Start from nothing: in a forked child, which owns none of the parent's holds."""
        self._lock = threading.Lock()
        self._holds = {}
        self._keys_of = {}
        self._unanswered = {}
        self._watched = False


_registries: weakref.WeakSet[HoldRegistry] = weakref.WeakSet()


def registries() -> list[HoldRegistry]:
    """Every live registry of this process (one per lock client)."""
    return list(_registries)


def _notify(callbacks: list[Callable[[T], object]], subject: T) -> None:
    for callback in list(callbacks):
        try:
            callback(subject)
        except Exception:
            logger.exception("hold event callback %r failed", callback)


@forking.after_fork_in_child
def _reset_registries_after_fork() -> None:
    for registry in list(_registries):
        registry.forget_all()


# The leak reports (a floor below) read the registries through this.
leaks.keepers_from(registries)
