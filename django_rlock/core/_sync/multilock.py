"""MultiLock and RedLock: one lock made of RLocks on several Redis servers.

Both take RLocks that may come from different :class:`LockClient` objects, and
have the RLock's methods (``acquire``, ``release``, ``with``, ``locked``,
``owned``, ``hold_count``, ``ttl``, ``force_release``, ``token``, ``lost``,
``on_lost``). Like an RLock, one object may be shared by many threads, each its
own owner, and each is reentrant.

**MultiLock** (Redisson's RedissonMultiLock) is all-or-nothing: it holds every
member or none. Use it to take several locks at once, wherever they live::

    orders = LockClient("redis://orders-redis:6379/0")
    stock = LockClient("redis://stock-redis:6379/0")
    with orders.multi_lock(orders.lock("order:42"), stock.lock("sku:7")):
        ...  # both held

An attempt takes the members in order; when one is busy past the round's
wait, the ones taken are released and, while the wait allows, the round starts
again after a random pause (two MultiLocks taking the same locks in opposite
orders cannot deadlock). A member whose wait closes a deadlock through a
member the round took (a :class:`DeadlockError`, see docs/deadlocks.md) fails
the round the same way; one that closes it through a lock the caller holds
outside the MultiLock raises, as another round could not break it. With a
``lease`` the members are taken with a lease at least twice the round's wait,
then all are re-expired to ``lease`` together, so none expires before the
others; with ``lease=None`` each member's watchdog keeps it alive. ``release``
releases every member and raises LockLostError naming any that was lost.

**RedLock** is the Redlock algorithm over N independent masters (3 or 5 is
usual): it tries every member once, each call bounded by a short socket timeout,
and holds the lock when a majority (N/2+1) granted it within the *validity
time* ``ttl - elapsed - (0.01 * ttl + 2 ms)``, where ``ttl`` is the lease (or
the watchdog timeout). Otherwise it releases what it took and, while the wait
allows, tries again after a random delay. It survives the loss of a minority of
servers, while held too: it counts as lost only when fewer than a majority of
its members are still held.

Redlock's safety is contested (Martin Kleppmann, "How to do distributed
locking", 2016): it assumes bounded clock drift, network delay and process
pauses, and a paused holder can outlive its validity like any lease-based lock.
Redisson has deprecated its RedLock for this reason. Treat RedLock, like every
Redis lock, as an efficiency lock; where correctness matters, pass a fencing
token to the resource and have it refuse stale ones. Tokens are per server, so
use one member's token (``lock.token[i]``, always the same ``i``) against a
resource that only accepts increasing values.
"""

from __future__ import annotations

import contextlib
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Self

import redis

from django_rlock.core._process import forking
from django_rlock.core._process.identity import thread_owner
from django_rlock.core._process.lockorder import taken_together
from django_rlock.core._protocol import clock
from django_rlock.core._protocol.lock import LockScripts, check_blocking, gave_up_after
from django_rlock.core._protocol.names import check_lease, check_timeout, milliseconds
from django_rlock.core._protocol.unavailable import reported_unavailable
from django_rlock.core._sync.locks import RLock
from django_rlock.core.exceptions import (
    DeadlockError,
    LockLostError,
    LockNotOwnedError,
    LockNotReplicatedError,
    LockTimeout,
    LockUnavailableError,
)

if TYPE_CHECKING:
    from django_rlock.core._protocol.holds import Hold


#: What a member's public call raises when its server cannot be used: a group
#: lock then counts that member as not held (its key expires on its own).
_UNREACHABLE = (redis.RedisError, LockUnavailableError)


#: Redisson's base wait per member and round: 1.5 s.
_ROUND_WAIT_PER_LOCK = 1.5


#: The socket timeouts RedLock may use per server call (seconds): a few
#: buckets, so that varying leases share a handful of connection pools.
_ATTEMPT_TIMEOUTS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def validity_time(ttl: float, elapsed: float) -> float:
    """Redlock's validity time: ``ttl - elapsed - (0.01 * ttl + 0.002)`` seconds.

    The drift term (:func:`~django_rlock.core._protocol.clock.drift`) allows for the
    servers' clocks running at slightly different rates, plus 2 ms for the
    expiry's own granularity.
    """
    return ttl - elapsed - clock.drift(ttl)


@dataclass(eq=False)
class _Acquisition:
    """One successful acquire by one thread: the member holds it took, one each."""

    members: tuple[RLock, ...]
    holds: tuple[Hold, ...]
    validity: float
    #: RedLock: the bound on each server call this acquisition was made with.
    call_timeout: float = 0.0
    reported: bool = False


class _GroupLock:
    """What MultiLock and RedLock share: per-thread acquisitions, release, inspection."""

    def __init__(
        self,
        *locks: RLock,
        timeout: float | None = None,
        lease: float | None = None,
        blocking: bool = True,
    ) -> None:
        if not locks:
            raise ValueError(f"{type(self).__name__} needs at least one lock")
        for lock in locks:
            if not isinstance(lock, RLock):
                raise ValueError(
                    f"{type(self).__name__} takes RLock objects, not {type(lock).__name__}"
                )
        self.locks: tuple[RLock, ...] = tuple(locks)
        self.timeout = check_timeout(timeout)
        self.lease = check_lease(lease)
        # Refused when built, as a member lock's are: not at the first ``with``.
        self.blocking = check_blocking(blocking, self.timeout)
        self.lost_callbacks: list[Callable[[_GroupLock], object]] = []
        self._local = threading.local()
        self._active_lock = threading.Lock()
        forking.renew_after_fork(self, "_active_lock")
        self._active: set[_Acquisition] = set()
        for lock in self.locks:
            lock.on_lost(self._member_lost)

    def _needed(self) -> int:
        """How many member holds must stay alive for an acquisition to count as held."""
        raise NotImplementedError

    @property
    def name(self) -> str:
        """The member names, joined with '+'."""
        return "+".join(lock.name for lock in self.locks)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {[lock.name for lock in self.locks]!r}>"

    def _stack(self) -> list[_Acquisition]:
        stack: list[_Acquisition] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def acquire(
        self, blocking: bool = True, timeout: float | None = None, lease: float | None = None
    ) -> bool:
        """Take the lock (or one more hold on it); True when held.

        ``blocking``, ``timeout`` and ``lease`` mean what they mean for
        :meth:`RLock.acquire`.
        """
        wait = check_timeout(timeout)
        lease_seconds = check_lease(lease)
        check_blocking(blocking, wait)
        started = clock.monotonic()
        deadline = math.inf if wait is None else started + wait
        with taken_together():  # in no order among themselves (the lock order check)
            acquisition = self._acquire(blocking and wait != 0, deadline, lease_seconds)
        if acquisition is None:
            return False
        self._stack().append(acquisition)
        with self._active_lock:
            self._active.add(acquisition)
        self._local.lost = False
        return True

    def _acquire(self, blocking: bool, deadline: float, lease: float | None) -> _Acquisition | None:
        raise NotImplementedError

    def _record(self, members: Sequence[RLock], validity: float) -> _Acquisition:
        """The acquisition of ``members``, each just granted to the calling thread."""
        owner = thread_owner()
        holds = []
        for member in members:
            hold = member.client.holds.newest(member.keys.hash, owner)
            assert hold is not None, "a member just granted has a hold"
            holds.append(hold)
        return _Acquisition(tuple(members), tuple(holds), validity)

    def __enter__(self) -> Self:
        if not self.acquire(self.blocking, self.timeout, self.lease):
            raise LockTimeout(
                f"could not acquire {type(self).__name__} {self.name!r} "
                f"{gave_up_after(self.blocking, self.timeout)}",
                name=self.name,
                retry_after=self.ttl(),
            )
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
        """Give back one hold of every member this thread's last acquire took.

        Raises :class:`LockNotOwnedError` (changing nothing) when the calling
        thread holds nothing, and :class:`LockLostError` when the lock was lost
        while held (see the class for what that means for each kind).
        """
        stack = self._stack()
        if not stack:
            raise LockNotOwnedError(
                f"cannot release {type(self).__name__} {self.name!r}: "
                "the calling thread does not hold it",
                name=self.name,
            )
        acquisition = stack.pop()
        with self._active_lock:
            self._active.discard(acquisition)
        released: list[RLock] = []
        failed: list[RLock] = []
        error: Exception | None = None
        for member in reversed(acquisition.members):
            try:
                member.release()
                released.append(member)
            except LockNotOwnedError:  # LockLostError included
                failed.append(member)
            except _UNREACHABLE as unreachable:
                failed.append(member)
                error = error or unreachable
        if len(released) < self._needed():
            self._local.lost = True
            names = sorted(member.name for member in failed)
            raise LockLostError(
                f"{type(self).__name__} {self.name!r} was lost: member(s) {names} expired, "
                "were taken over or could not be reached before release",
                name=self.name,
            ) from error

    def force_release(self) -> bool:
        """Delete every member whoever holds it and wake its waiters; True if any was held.

        A member whose server cannot be reached is skipped (its key expires).
        """
        held = False
        for member in self.locks:
            try:
                held = member.force_release() or held
            except _UNREACHABLE:
                continue
        return held

    # -- inspecting ---------------------------------------------------------------

    def locked(self) -> bool:
        """True when the lock is held by anyone (see each subclass)."""
        raise NotImplementedError

    def ttl(self) -> float | None:
        """Seconds until the lock is free, None when it is free (see each subclass)."""
        raise NotImplementedError

    def _count_reachable(self, ask: Callable[[RLock], bool]) -> int:
        count = 0
        for member in self.locks:
            try:
                count += bool(ask(member))
            except _UNREACHABLE:
                continue  # an unreachable member counts as not held
        return count

    def owned(self) -> bool:
        """True when the calling thread holds the lock (asks every member's server)."""
        if not self._stack():
            return False
        return self._count_reachable(RLock.owned) >= self._needed()

    def hold_count(self) -> int:
        """How many holds the calling thread has on this lock (0 when none)."""
        return len(self._stack())

    @property
    def token(self) -> tuple[int | None, ...] | None:
        """The fencing tokens of the calling thread's member holds, one per lock in order.

        None when the thread does not hold the lock; an entry is None for a
        member a RedLock did not get. Each server counts its own tokens.
        """
        stack = self._stack()
        if not stack:
            return None
        current = stack[-1]
        tokens = {
            id(member): hold.token
            for member, hold in zip(current.members, current.holds, strict=True)
        }
        return tuple(tokens.get(id(member)) for member in self.locks)

    @property
    def lost(self) -> bool:
        """True when the calling thread's current (newest) hold on this lock was lost.

        Stays true after the lost hold is released, until this thread acquires
        again; a new grant clears it at once, whether the lost hold was
        released or not (as :attr:`RLock.lost <django_rlock.core.RLock.lost>`).
        """
        stack = self._stack()
        if not stack:
            return bool(getattr(self._local, "lost", False))
        return self._is_lost(stack[-1])

    def _is_lost(self, acquisition: _Acquisition) -> bool:
        alive = 0
        now = clock.monotonic()
        for member, hold in zip(acquisition.members, acquisition.holds, strict=True):
            if not hold.lost and now >= hold.deadline:
                member.client.declare_lost(hold, "its deadline passed without a renewal")
            alive += not hold.lost
        return alive < self._needed()

    def on_lost(self, callback: Callable[[_GroupLock], object]) -> None:
        """Call ``callback(self)`` once when a hold on this lock is lost.

        It runs on a short-lived thread of its own. Registering this lock also
        registered a relay on each member RLock.
        """
        self.lost_callbacks.append(callback)

    def _member_lost(self, member: RLock) -> None:
        # Called on a member's on_lost thread: report each acquisition once.
        with self._active_lock:
            newly_lost = [
                acquisition
                for acquisition in self._active
                if not acquisition.reported
                and any(held is member for held in acquisition.members)
                and sum(not hold.lost for hold in acquisition.holds) < self._needed()
            ]
            for acquisition in newly_lost:
                acquisition.reported = True
        for _ in newly_lost:
            for callback in self.lost_callbacks:
                callback(self)


def _closed_by(error: DeadlockError, waiting: RLock, taken: Sequence[RLock]) -> bool:
    """Whether the deadlock ``waiting``'s acquire broke closes through a lock of ``taken``.

    The cycle's last entry is the lock the caller holds that the next member
    waits for; a cycle lives on one deployment, the waiting member's.
    """
    if not error.cycle:
        return False
    closing = error.cycle[-1]
    return any(
        member.client is waiting.client
        and member.name == closing.get("lock")
        and member.kind == closing.get("kind", "lock")
        for member in taken
    )


def _release_quietly(members: Sequence[RLock]) -> None:
    """Give back one hold of each member; for undoing a partial acquisition."""
    for member in reversed(members):
        try:
            member.release()
        except (LockNotOwnedError, *_UNREACHABLE):
            continue  # lost or unreachable: its key expires on its own


class MultiLock(_GroupLock):
    """All-or-nothing over several RLocks, possibly on different servers.

    Get one from :meth:`LockClient.multi_lock`; see the module docstring.
    ``ttl()`` is the shortest member's; ``locked()`` is true when any member
    is held (so an acquire would have to wait).
    """

    def _needed(self) -> int:
        return len(self.locks)

    def _acquire(self, blocking: bool, deadline: float, lease: float | None) -> _Acquisition | None:
        base_wait = _ROUND_WAIT_PER_LOCK * len(self.locks)
        while True:
            remaining = deadline - clock.monotonic()
            # A random round length breaks the symmetry between two MultiLocks
            # that take the same locks in opposite orders.
            round_wait = min(remaining, random.uniform(0.5, 1.0) * base_wait) if blocking else 0
            # Long enough that the first member outlives the wait for the last.
            member_lease = None if lease is None else max(lease, 2 * round_wait)
            taken = self._take_all(max(round_wait, 0.0), member_lease)
            if taken is not None:
                try:
                    if lease is None or self._reexpire(taken, lease):
                        return self._record(taken, validity=math.inf if lease is None else lease)
                except BaseException:
                    _release_quietly(taken)
                    raise
                _release_quietly(taken)
            remaining = deadline - clock.monotonic()
            if not blocking or remaining <= 0:
                return None
            time.sleep(min(remaining, random.uniform(0, 0.05)))

    def _take_all(self, round_wait: float, lease: float | None) -> list[RLock] | None:
        """One round: every member in order, or none (None) when one stays busy or deadlocks.

        A member's :class:`DeadlockError` whose cycle closes through a member
        this round took is a failed round like a busy member: giving back what
        the round took breaks that cycle, and the next round starts after the
        usual pause. A cycle through a lock the caller holds outside this
        MultiLock cannot be broken by another round: the error is raised.
        """
        round_deadline = clock.monotonic() + round_wait
        taken: list[RLock] = []
        try:
            for member in self.locks:
                left = max(0.0, round_deadline - clock.monotonic())
                try:
                    granted = member.acquire(True, left, lease)
                except DeadlockError as error:
                    if not _closed_by(error, member, taken):
                        raise
                    granted = False
                if not granted:
                    _release_quietly(taken)
                    return None
                taken.append(member)
        except BaseException:
            _release_quietly(taken)
            raise
        return taken

    @staticmethod
    def _reexpire(taken: Sequence[RLock], lease: float) -> bool:
        """Set every newly granted member to expire ``lease`` seconds from now."""
        owner = thread_owner()
        for member in taken:
            client = member.client
            hold = client.holds.newest(member.keys.hash, owner)
            if hold is None or hold.count != 1:
                continue  # a re-entry never shortens the hold it re-enters
            sent_at = clock.monotonic()
            # '1': set this expiry even though it is shorter than the grant's.
            with reported_unavailable(client.server, "acquire", member.name):
                left = client.scripts[LockScripts].renew(
                    keys=list(member.hold_keys(owner)),
                    args=[milliseconds(lease), 1, owner],
                )
            pttl_ms = int(left[0])
            if pttl_ms <= 0:
                return False
            # Set anew, not extended: this call shortened the key on purpose.
            client.holds.set_deadline(hold, sent_at, pttl_ms)
        return True

    def locked(self) -> bool:
        """True when any member is held by anyone."""
        return any(member.locked() for member in self.locks)

    def ttl(self) -> float | None:
        """Seconds until the first held member expires; None when no member is held."""
        ttls = [ttl for ttl in (member.ttl() for member in self.locks) if ttl is not None]
        return min(ttls) if ttls else None


class RedLock(_GroupLock):
    """The Redlock algorithm over RLocks on independent servers (see the module docstring).

    Get one from :meth:`LockClient.red_lock`. Each member must come from its
    own :class:`LockClient`. ``attempt_timeout`` bounds each server call (None:
    about ``ttl / (10 * N)``, between 10 ms and 1 s); ``retry_delay`` is the
    longest random pause between two attempts.
    """

    def __init__(
        self,
        *locks: RLock,
        timeout: float | None = None,
        lease: float | None = None,
        blocking: bool = True,
        attempt_timeout: float | None = None,
        retry_delay: float = 0.2,
    ) -> None:
        super().__init__(*locks, timeout=timeout, lease=lease, blocking=blocking)
        clients = [id(lock.client) for lock in self.locks]
        if len(set(clients)) != len(clients):
            raise ValueError("RedLock needs each lock from its own LockClient (its own server)")
        if attempt_timeout is not None and not attempt_timeout > 0:
            raise ValueError(
                f"attempt_timeout must be > 0 seconds or None, got {attempt_timeout!r}"
            )
        self.attempt_timeout = attempt_timeout
        delay = check_timeout(retry_delay)
        if delay is None:
            raise ValueError("retry_delay must be >= 0 seconds, not None")
        self.retry_delay = delay
        self.quorum = len(self.locks) // 2 + 1

    @property
    def validity(self) -> float | None:
        """Redlock's validity time of the calling thread's hold, in seconds.

        How long after the acquire began the hold may be relied on (for a fixed
        lease); None when the thread holds nothing.
        """
        stack = self._stack()
        return stack[-1].validity if stack else None

    def _needed(self) -> int:
        return self.quorum

    def release(self) -> None:
        """Release every member, also those the acquire did not get (as Redlock asks).

        A server that did not answer may still have granted the lock; it is
        sent a release too (bounded by the call timeout), unless the thread
        holds that member otherwise. Raises :class:`LockLostError` when fewer
        than a majority of members were still held.
        """
        stack = self._stack()
        acquisition = stack[-1] if stack else None
        try:
            super().release()
        finally:
            if acquisition is not None and acquisition not in stack:  # it was released
                owner = thread_owner()
                for member in self.locks:
                    if all(member is not taken for taken in acquisition.members):
                        self._release_unanswered(member, owner, acquisition.call_timeout)

    def _acquire(self, blocking: bool, deadline: float, lease: float | None) -> _Acquisition | None:
        ttl = lease or min(lock.client.watchdog_timeout for lock in self.locks)
        while True:
            acquisition = self._attempt_all(lease, ttl)
            if acquisition is not None:
                return acquisition
            remaining = deadline - clock.monotonic()
            if not blocking or remaining <= 0:
                return None
            time.sleep(min(remaining, random.uniform(0, self.retry_delay)))

    def _bounded_timeout(self, ttl: float) -> float:
        if self.attempt_timeout is not None:
            return self.attempt_timeout
        wanted = ttl / (10 * len(self.locks))
        fitting = [bucket for bucket in _ATTEMPT_TIMEOUTS if bucket <= wanted]
        return fitting[-1] if fitting else _ATTEMPT_TIMEOUTS[0]

    def _attempt_all(self, lease: float | None, ttl: float) -> _Acquisition | None:
        owner = thread_owner()
        call_timeout = self._bounded_timeout(ttl)
        started = clock.monotonic()
        taken: list[RLock] = []
        unknown: list[RLock] = []
        for member in self.locks:
            try:
                if member.attempt_as(owner, lease, via=member.client.bounded(call_timeout)):
                    taken.append(member)
            except LockNotReplicatedError:
                continue  # granted, too few replicas confirmed, undone: not taken
            except redis.RedisError:
                unknown.append(member)  # it may have been granted before the reply was lost
        validity = validity_time(ttl, clock.monotonic() - started)
        if len(taken) >= self.quorum and validity > 0:
            acquisition = self._record(taken, validity)
            acquisition.call_timeout = call_timeout
            return acquisition
        _release_quietly(taken)
        for member in unknown:
            self._release_unanswered(member, owner, call_timeout)
        return None

    @staticmethod
    def _release_unanswered(member: RLock, owner: str, call_timeout: float) -> None:
        """Undo a grant that may have happened on a server that did not answer.

        Only when the thread held nothing there before: one release of an
        older hold would take away a hold that is still wanted.
        """
        client = member.client
        if client.holds.newest(member.keys.hash, owner) is not None:
            return
        # Still unreachable: a grant there expires with its lease.
        with contextlib.suppress(redis.RedisError):
            member.release_as(owner, via=client.bounded(call_timeout))

    def locked(self) -> bool:
        """True when a majority of members are held by anyone (unreachable ones count as free)."""
        return self._count_reachable(RLock.locked) >= self.quorum

    def ttl(self) -> float | None:
        """Seconds until fewer than a majority of members are held; None when that is now."""
        ttls: list[float] = []
        for member in self.locks:
            try:
                ttl = member.ttl()
            except _UNREACHABLE:
                continue
            if ttl is not None:
                ttls.append(ttl)
        if len(ttls) < self.quorum:
            return None
        return sorted(ttls, reverse=True)[self.quorum - 1]
