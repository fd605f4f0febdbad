"""The world a model run acts on: a real redis-server, faulty links, and lock owners.

::

    with World(Config()) as world:          # server, proxies, clients, owners
        world.submit(0, Acquire("a", lease=None, wait=0.6))
        world.partition(0, seconds=1.0)     # owner 0's client cut off for 1 s
        world.check()                       # raises ModelViolation if an invariant broke
    # leaving checks that nothing grew: connections, threads, keys, channels

Every client reaches the server through its own :class:`FaultProxy`, so a
partition, a stall of its link or a lost reply hits one client (its owners and
their watchdog renewals) while rivals on other clients carry on. Owners are
sync threads (each its own owner, several per client) and asyncio tasks on one
:class:`AsyncLockClient`; each runs the operations it is given in order, on
its own, so operations of different owners overlap in time as in production.

Owners announce the scopes they work in (:class:`~tests.model.history.Scope`):
a thread's life (``Config.thread_ends``: a thread may end holding, and a new
thread takes its place), an asyncio task's life (its acquires may go through
``asyncio.wait_for``, ``shield`` or ``gather``: ``Config.ways``), a unit of
work on a long-lived thread (``Config.unit_workers``: ``work_started`` and
``work_ended("request")``, as Django's request signals and Celery's task-run
signals call them), a child process whose main thread takes a lock, starts a
non-daemon thread and returns (``Config.processes``). With
``Config.gc_passes``, ``gc.collect()`` runs on a thread of its own at random
and owners acquire through lock objects left in reference cycles. What each
scope claims is checked against what the library did
(:meth:`~tests.model.history.History.check_ownership`).

Names may also be semaphores (``Config.semaphores``: owners take and give
back permits) and read-write locks (``Config.rw_names``: owners take the
``read`` or the ``write`` side), each judged by its own invariants
(:mod:`tests.model.history`). An operator (a direct client) force-releases
locks, semaphores and both sides of read-write locks; the admin connection
injects the server-side faults. What every owner saw goes into a
:class:`~tests.model.history.History`, which the checks read.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import math
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_rlock.core import LockClient, LockLostError, LockNotOwnedError, RLock
from django_rlock.core._process import leaks
from django_rlock.core._process.identity import task_owner, thread_owner
from django_rlock.core._protocol import clock
from django_rlock.core._protocol.fairlock import FairKeys, fair_keys
from django_rlock.core._protocol.holds import Hold
from django_rlock.core._protocol.names import LockKeys
from django_rlock.core._protocol.rwlock import RWKeys
from django_rlock.core._protocol.semaphore import permit_prefix, semaphore_keys
from django_rlock.core.aio import AsyncLockClient, AsyncRLock
from django_rlock.core.exceptions import LockUpgradeError
from tests.faults.conftest import server_major
from tests.faults.proxy import FaultProxy
from tests.model.history import (
    DOUBLE_HOLDER,
    HOLDER_NOT_TOLD,
    LEAK,
    LOCK,
    PERMIT,
    PROCESS_SCOPE,
    READ,
    RELEASE_OUTCOME,
    TASK_SCOPE,
    THREAD_SCOPE,
    UNIT_SCOPE,
    UPGRADE,
    WRITE,
    Claim,
    History,
    Scope,
)
from tests.servers import RedisServer

__all__ = [
    "BUG_FAULTS",
    "DATA_LOSS",
    "FAULTS",
    "WAYS",
    "Acquire",
    "Config",
    "EndThread",
    "NextUnit",
    "Release",
    "World",
]

PREFIX = "model"

T = TypeVar("T")

#: The longest any one operation may take: far beyond a wait (1.5 s) plus a few
#: socket timeouts, so reaching it means a call hangs.
BUSY_LIMIT = 30.0

#: How often the pause watch (World._watch_pauses) wakes, in seconds.
PAUSE_TICK = 0.02

#: Releases the end of a run retries, besides one per hold (see Owner.release_tries).
RELEASE_RETRIES = 10

#: Faults that keep every lock on the server (or take one away by an operator's hand).
FAULTS = frozenset(
    {"partition", "stall", "drop_reply", "swallow_reply", "client_kill", "force_release"}
)
#: Faults that lose the server's data: FLUSHALL, restart without persistence.
DATA_LOSS = frozenset({"flushall", "restart"})
#: Everything the world can inject; ``close`` closes a client with live holds.
BUG_FAULTS = DATA_LOSS | {"close"}

#: How an asyncio owner can ask for a lock: ``await lock.acquire()``, or that call
#: under ``asyncio.wait_for``, ``asyncio.shield`` or ``asyncio.gather``.
WAYS = ("acquire", "wait_for", "shield", "gather")


@dataclass(frozen=True)
class Config:
    """What a model run may do. The defaults allow everything the world can do.

    ``mixed_reentry`` lets an owner re-enter a watchdog hold with a lease or a
    lease hold with the watchdog; ``retry_unanswered`` lets an owner retry an
    acquire at once after its reply was lost (otherwise it keeps off that
    name until the grant it may have got has expired). Both, and the data-loss
    and close faults, reached bugs that are fixed now (tests/model/test_known_bugs.py);
    turning them off narrows a soak to the other paths.
    """

    sync_clients: int = 2
    owners_per_client: int = 2
    async_owners: int = 2
    names: tuple[str, ...] = ("a", "b")
    watchdog_timeout: float = 0.9
    socket_timeout: float = 0.25
    leases: tuple[float, ...] = (0.3, 0.8, 2.0)
    faults: frozenset[str] = FAULTS | BUG_FAULTS
    mixed_reentry: bool = True
    retry_unanswered: bool = True
    #: Every lock is a fair lock (``fair_lock``): the same invariants hold.
    fair: bool = False
    #: Names that are semaphores of ``permits`` permits (besides the locks of ``names``).
    semaphores: tuple[str, ...] = ()
    permits: int = 2
    #: Names that are read-write locks: owners take their ``read`` or ``write`` side.
    rw_names: tuple[str, ...] = ()
    #: How the asyncio owners acquire (some of :data:`WAYS`).
    ways: tuple[str, ...] = ("acquire",)
    #: Thread owners may end holding what they hold; a new thread takes each one's place.
    thread_ends: bool = False
    #: Long-lived threads serving units of work one after another (after the other owners).
    unit_workers: int = 0
    #: A unit of work may take lease holds (they outlive the unit, and the thread's next
    #: unit must not re-enter them); off, its acquires ask for the watchdog.
    unit_leases: bool = True
    #: ``gc.collect()`` on a thread of its own at random; acquires through lock objects
    #: left in reference cycles.
    gc_passes: bool = False
    #: A child process's main thread takes a lock, starts a non-daemon thread, returns.
    processes: bool = False

    def __post_init__(self) -> None:
        unknown = set(self.ways) - set(WAYS)
        if unknown:
            raise ValueError(f"ways {sorted(unknown)}: not among {WAYS}")
        if self.unit_workers and not self.sync_clients:
            raise ValueError("unit workers are threads: they need a sync client")
        if len(set(self.all_names)) != len(self.all_names):
            raise ValueError(
                f"a name has one kind: names {self.names}, semaphores {self.semaphores} and "
                f"rw_names {self.rw_names} must not share one"
            )

    @property
    def all_names(self) -> tuple[str, ...]:
        """Every name of the run: locks, then semaphores, then read-write locks."""
        return (*self.names, *self.semaphores, *self.rw_names)

    def sides(self, name: str) -> tuple[str, ...]:
        """What an owner can hold of ``name``: a read-write lock's two sides, else one."""
        return (READ, WRITE) if name in self.rw_names else ("",)

    def kind_of(self, name: str, side: str) -> str:
        """The belief kind of a hold of ``side`` of ``name`` (see tests/model/history.py)."""
        if name in self.semaphores:
            return PERMIT
        if name in self.rw_names:
            return side
        return LOCK

    @property
    def owners(self) -> int:
        return self.sync_clients * self.owners_per_client + self.async_owners + self.unit_workers

    @property
    def thread_owners(self) -> tuple[int, ...]:
        """The indexes of the owners that are threads of their own (not unit workers)."""
        return tuple(range(self.sync_clients * self.owners_per_client))

    @property
    def unit_owners(self) -> tuple[int, ...]:
        """The indexes of the unit workers."""
        first = self.sync_clients * self.owners_per_client + self.async_owners
        return tuple(range(first, first + self.unit_workers))

    @property
    def margin(self) -> float:
        """How long a fault's effects may outlast it (see History.fault_near)."""
        return self.longest_hold + 2 * self.socket_timeout + 1.0

    @property
    def clients(self) -> int:
        """Lock clients: the sync ones, then the async one (if any owner is async)."""
        return self.sync_clients + (1 if self.async_owners else 0)

    @property
    def longest_hold(self) -> float:
        """How long an unrenewed grant may live on the server."""
        return max((*self.leases, self.watchdog_timeout))


@dataclass(frozen=True)
class Acquire:
    """Acquire ``name`` (re-entry when held): ``wait`` None is one attempt (blocking=False).

    ``side`` is READ or WRITE for a read-write lock, else empty.
    """

    name: str
    lease: float | None
    wait: float | None
    side: str = ""
    #: How: "acquire", one of :data:`WAYS` (asyncio owners), or "cycle": through a
    #: lock object of its own, left in a reference cycle for the garbage collector.
    how: str = "acquire"


@dataclass(frozen=True)
class EndThread:
    """The owner's thread ends, holding what it holds; a new thread takes its place."""


@dataclass(frozen=True)
class NextUnit:
    """The unit worker's unit of work ends (``work_ended``) and its next one starts."""


@dataclass(frozen=True)
class Release:
    """Release one hold of ``name`` (also when the owner holds none: that must be refused)."""

    name: str
    side: str = ""


@dataclass(frozen=True)
class ReportLost:
    """Check that every watchdog hold an owner believed in on its closed client reads as lost."""

    #: (name, side) of each such hold.
    believed: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ReleaseAll:
    """Release every hold the owner has, until its library records none (end of a run)."""


Operation = Acquire | Release | ReportLost | ReleaseAll | EndThread | NextUnit


class Owner:
    """One lock owner: its bookkeeping is the same for a thread and for a task."""

    def __init__(self, label: str, world: World, client_index: int) -> None:
        self.label = label
        self.world = world
        self.client_index = client_index
        self.history = world.history
        #: Names whose acquire went unanswered, with when the owner may try them again.
        self.tainted: dict[str, float] = {}
        #: Read-write names whose read release went unanswered, with when that read expires.
        self.unsure_reads: dict[str, float] = {}
        self.pending = 0
        self._pending_lock = threading.Lock()
        #: The library's owner id of this thread or task, once it runs.
        self.owner_id = ""
        #: How the owner's last release ended (None: it went through).
        self.last_release_error: BaseException | None = None
        #: Whether the owner works in units of work (ThreadOwner's unit workers).
        self.units = False
        #: The scope the owner works in now, and what it claims there by (name, side).
        self.scope: Scope | None = None
        self.claims: dict[tuple[str, str], Claim] = {}

    # -- implemented by the thread and the task owners -----------------------------

    def lock(self, name: str, side: str = "") -> Any:
        raise NotImplementedError

    def holds(self, name: str, side: str = "") -> list[Hold]:
        raise NotImplementedError

    # -- shared bookkeeping ----------------------------------------------------------

    def top(self, name: str, side: str = "") -> Hold | None:
        stack = self.holds(name, side)
        return stack[-1] if stack else None

    def kind(self, name: str, side: str) -> str:
        return self.world.config.kind_of(name, side)

    def outcome(self, name: str, side: str, text: str) -> None:
        """Count an operation's outcome, under its kind (a lock's bare, as before kinds)."""
        kind = self.kind(name, side)
        self.history.operation(text if kind == LOCK else f"{kind} {text}")

    def reading(self, op: Acquire) -> Hold | None:
        """For a write of a read-write lock, the owner's newest read hold (else None)."""
        return self.top(op.name, READ) if op.side == WRITE else None

    def upgrade_refused(self, op: Acquire, read: Hold | None) -> None:
        """LockUpgradeError: expected of an owner that may hold a read, a violation otherwise."""
        self.outcome(op.name, op.side, "acquire LockUpgradeError")
        now = clock.monotonic()
        # The server may keep a read the owner does not count: one whose grant or
        # release went unanswered, until it expires.
        unsure = max(self.tainted.get(op.name, 0.0), self.unsure_reads.get(op.name, 0.0))
        if read is None and now >= unsure:
            self.history.violated(
                UPGRADE,
                f"{self.label} asked to write {op.name!r} holding no read and got LockUpgradeError",
            )

    def check_upgrade(
        self, op: Acquire, before: Hold | None, read: Hold | None, granted: bool, at: float
    ) -> None:
        """A new write grant while the owner's read lived on the server: an upgrade let through."""
        if read is None or not granted or self.top(op.name, op.side) is before:
            return
        belief = self.history.belief_of(read)
        if (
            not read.lost
            and not read.released
            and read.deadline > at
            and belief is not None
            and not self.history.excused(belief, at)
        ):
            self.history.violated(
                UPGRADE,
                f"{self.label} was granted the write of {op.name!r} while its read lived "
                f"[{belief.describe()}]: a reader asking to write must get LockUpgradeError",
            )

    def acquire_lease(self, op: Acquire) -> float | bool | None:
        """The lease to ask for, or False to skip the operation (known-bug discipline)."""
        config = self.world.config
        if self.units and not config.unit_leases and op.lease is not None:
            op = Acquire(op.name, None, op.wait, op.side, op.how)  # a known bug's path
        top = self.top(op.name, op.side)
        held = top is not None and not top.lost
        until = self.tainted.get(op.name)
        if until is not None and not config.retry_unanswered:
            if held or clock.monotonic() < until:
                return False
            del self.tainted[op.name]
        if held and not config.mixed_reentry:
            assert top is not None
            if top.watchdog != (op.lease is None):
                return None if top.watchdog else config.leases[0]
        return op.lease

    def acquired(self, name: str, side: str, before: Hold | None, granted: bool, at: float) -> None:
        self.outcome(name, side, "acquire granted" if granted else "acquire refused")
        if not granted:
            return
        hold = self.top(name, side)
        if hold is None:
            # The grant went to another owner id (a task wait_for or shield ran it in):
            # the claim says so (History.check_ownership), there is no belief to keep.
            self.history.operation("acquire granted to another owner id")
            return
        kind = self.kind(name, side)
        if hold is not before:
            # Under the model's name: a broken world's lock may be another name's.
            self.history.granted(self.label, hold, at, kind, name)
        elif kind == PERMIT and (belief := self.history.belief_of(hold)) is not None:
            # A re-entry of a semaphore is one more permit, believed from now on.
            belief.counts.append((at, hold.count))

    def acquire_failed(self, name: str, side: str, error: BaseException) -> None:
        self.outcome(name, side, f"acquire {type(error).__name__}")
        # Unanswered (a timeout, a reset twice, however the library words it): the
        # server may have granted it. Stay off until that grant has expired.
        self.tainted[name] = clock.monotonic() + self.world.config.longest_hold + 0.5

    # -- scopes and claims (History.check_ownership) ------------------------------------

    def begin_scope(self, kind: str) -> None:
        self.scope = self.history.scope_began(self.label, kind)
        self.claims = {}

    def end_scope(self) -> None:
        """The owner's scope ends now: its watchdog claims end with it, its lease claims run on."""
        scope = self.scope
        assert scope is not None
        now = clock.monotonic()
        for claim in self.claims.values():
            belief = None if claim.hold is None else self.history.belief_of(claim.hold)
            if claim.first_lease is None and belief is not None and belief.released_at is None:
                belief.released_at = now  # from here on the library may give it back
        self.history.scope_ended(scope)
        self.claims = {}

    def claim_granted(self, op: Acquire, lease: float | None, sent_at: float, at: float) -> None:
        """Count a grant in the owner's scope: a new claim, or one more of its claim."""
        key = (op.name, op.side)
        claim = self.claims.get(key)
        hold = self.top(op.name, op.side)
        if claim is not None and (
            claim.hold is not hold if claim.hold is not None else claim.natural_end() <= sent_at
        ):
            claim = None  # the library counts a new hold (its lease ended): a new grant
        lease_end = None if lease is None else sent_at + lease
        if claim is None:
            assert self.scope is not None
            claim = self.claims[key] = Claim(
                scope=self.scope,
                name=op.name,
                kind=self.kind(op.name, op.side),
                how=op.how,
                sent_at=sent_at,
                granted_at=at,
                first_lease=lease,
                lease_end=lease_end,
                hold=hold,
            )
            self.history.claimed(claim)
            return
        claim.count += 1
        if lease_end is not None:
            # A re-entry never shortens the key's life (it lengthens it to its ttl), and
            # the hold lived until this re-entry: it lives at least until the latest end.
            claim.lease_end = max(lease_end, claim.lease_end or lease_end)

    def claim_releasing(self, name: str, side: str) -> tuple[Claim | None, float]:
        """As a release starts: the claim it gives back one count of (None: none claimed)."""
        started = clock.monotonic()
        claim = self.claims.get((name, side))
        if claim is None:
            return None, started
        claim.count -= 1
        if claim.count <= 0:
            claim.released_at = started
            del self.claims[name, side]
        return claim, started

    def claim_released(
        self, before: tuple[Claim | None, float], error: BaseException | None
    ) -> None:
        claim, started = before
        if claim is not None and isinstance(error, LockNotOwnedError):
            self.history.release_refused(claim, type(error).__name__, started, clock.monotonic())

    def cycled_lock(self, name: str, side: str) -> Any:
        """A lock object of its own for ``name``, left in a reference cycle once used.

        Only the garbage collector frees it (``gc.collect()`` on whichever
        thread runs it): a library that released on a finalizer would release
        here, its owner still holding.
        """
        links = self.world.links[self.client_index]
        client = links.sync if links.sync is not None else links.aio
        assert client is not None
        lock = self.world.make_lock(client, name, side)
        knot: dict[str, Any] = {"lock": lock}
        knot["itself"] = knot
        return lock

    def release_tries(self, name: str, side: str) -> int:
        """How many releases the end of a run makes at most on ``name``'s ``side``.

        One per hold the owner's client counts (an example of acquires only
        re-enters a name a dozen times), and :data:`RELEASE_RETRIES` for
        releases that fail under faults and leave the hold counted.
        """
        return sum(hold.count for hold in self.holds(name, side)) + RELEASE_RETRIES

    def releasing(self, name: str, side: str) -> tuple[Hold | None, float, float, bool]:
        """As a release starts: what it starts from, with the belief it ends set so now.

        The checks run while the call is on its way: the server may have given
        the permit or the lock to another owner before the reply comes (or,
        with a lost reply, a socket timeout later), and the owner stopped
        counting on it when it started to give it back.
        """
        hold = self.top(name, side)
        started = clock.monotonic()
        if hold is None:
            return None, started, 0.0, False
        belief = self.history.belief_of(hold)
        if belief is not None and belief.kind == PERMIT:
            # One permit fewer from the moment its release starts, whatever the outcome.
            belief.counts.append((started, hold.count - 1))
        elif belief is not None and hold.count == 1 and belief.released_at is None:
            belief.released_at = started  # its last hold
        return hold, started, hold.deadline, hold.lost

    def released(
        self,
        name: str,
        side: str,
        before: tuple[Hold | None, float, float, bool],
        error: BaseException | None,
    ) -> None:
        hold, started, deadline, was_lost = before
        answered = clock.monotonic()
        outcome = "ok" if error is None else type(error).__name__
        self.outcome(name, side, f"release {outcome}")
        if side == READ and error is not None and not isinstance(error, LockNotOwnedError):
            # Its outcome is unknown: the server may keep the read until it expires.
            # (A read declared lost may live on too, but the owner's write takes
            # it off: its client tells the script.)
            self.unsure_reads[name] = answered + self.world.config.longest_hold + 0.5
        if name in self.tainted:
            # A release while tainted: the possible orphan grant ends from here on.
            self.tainted[name] = answered + self.world.config.longest_hold + 0.5
        if hold is None:
            self.history.released_elsewhere(self.label, name, self.kind(name, side), started)
            if isinstance(error, LockLostError):
                self.history.violated(
                    RELEASE_OUTCOME,
                    f"{self.label} released {name!r} holding nothing and got LockLostError",
                )
            return
        belief = self.history.belief_of(hold)
        # A last hold's belief ended as its release started (releasing); so did
        # one of several holds the server said were its last. A release of one
        # of several that finds the lock lost ends the belief only when the loss
        # is declared (History.declaring_lost): the owner held the others meanwhile.
        if belief is not None and hold.released and belief.released_at is None:
            belief.released_at = started
        if type(error) is LockNotOwnedError:
            self.history.violated(
                RELEASE_OUTCOME,
                f"{self.label} released {name!r} while the library recorded its hold "
                f"(lost={hold.lost}) and got LockNotOwnedError, not LockLostError",
            )
        elif was_lost and not isinstance(error, LockLostError):
            self.history.violated(
                RELEASE_OUTCOME,
                f"{self.label} released {name!r}, a hold already known lost, and got {outcome}",
            )
        elif (
            isinstance(error, LockLostError)
            and not was_lost
            and answered < deadline
            and belief is not None
            # Taken away before the release ran: by then it may have started.
            and not self.history.revoked(belief.name, belief.sent_at, answered)
        ):
            self.history.violated(
                DOUBLE_HOLDER,
                f"{self.label} released {name!r} {1000 * (deadline - answered):.0f} ms before "
                f"its deadline and found it lost: the server dropped a hold its owner believed "
                f"in [{belief.describe()}]",
            )

    def report_lost(self, name: str, side: str, lost: bool) -> None:
        if not lost:
            self.history.violated(
                HOLDER_NOT_TOLD,
                f"{self.label}'s client was closed while it held {name!r} {side}; "
                f"lock.lost stays False "
                f"(its hold ended untold: the key expires unrenewed)",
            )

    def submit(self, op: Operation) -> concurrent.futures.Future[None]:
        """Hand ``op`` to the owner once it is done with the previous one (bounded wait)."""
        deadline = time.monotonic() + BUSY_LIMIT
        while True:
            with self._pending_lock:
                if not self.pending:
                    self.pending += 1
                    break
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.label} still busy after {BUSY_LIMIT} s: a call hangs")
            time.sleep(0.005)
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        done.add_done_callback(self._done)
        self._enqueue(op, done)
        return done

    def _done(self, _future: concurrent.futures.Future[None]) -> None:
        with self._pending_lock:
            self.pending -= 1

    def _enqueue(self, op: Operation, done: concurrent.futures.Future[None]) -> None:
        raise NotImplementedError


#: Exceptions an operation may end with under faults (Redis unreachable, slow...).
EXPECTED = (redis.RedisError, LockNotOwnedError, ConnectionError, TimeoutError)


class ThreadOwner(Owner):
    """An owner that is a thread of its own, with one RLock per name on its client.

    A unit worker (``units``) works in units of work, announced to the library
    as a request's are; another thread owner's scope is its thread's life.
    """

    def __init__(self, label: str, world: World, client_index: int, *, units: bool = False) -> None:
        super().__init__(label, world, client_index)
        self.units = units
        self.ops: queue.Queue[tuple[Operation, concurrent.futures.Future[None]] | None] = (
            queue.Queue()
        )
        self.thread = self._start_thread()

    def _start_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name=f"model-{self.label}", daemon=True)
        thread.start()
        return thread

    def lock(self, name: str, side: str = "") -> RLock:
        return self.world.sync_lock(self.client_index, name, side)

    def holds(self, name: str, side: str = "") -> list[Hold]:
        lock = self.lock(name, side)
        return lock.client.holds.holds_of(lock.hold_keys(self.owner_id)[0], self.owner_id)

    def _enqueue(self, op: Operation, done: concurrent.futures.Future[None]) -> None:
        self.ops.put((op, done))

    def stop(self) -> None:
        self.ops.put(None)
        self.thread.join(30)

    def _run(self) -> None:
        self.owner_id = thread_owner()
        if self.units:
            leaks.work_started()
        self.begin_scope(UNIT_SCOPE if self.units else THREAD_SCOPE)
        while True:
            item = self.ops.get()
            if item is None:
                self.end_scope()
                if self.units:
                    leaks.work_ended("request")
                return
            op, done = item
            if isinstance(op, EndThread):
                # The scope ends as the thread does: what it holds may be given back
                # from here (its watchdog holds), and the next thread is a new owner.
                self.end_scope()
                self.history.operation("thread ended")
                self.thread = self._start_thread()
                done.set_result(None)
                return
            try:
                self._do(op)
            except BaseException as error:  # noqa: BLE001 -- handed to whoever waits on it
                done.set_exception(error)
            else:
                done.set_result(None)

    def _do(self, op: Operation) -> None:
        # The library may give the thread a new owner id (after a unit of work that
        # kept a hold): the model reads the library's books under the current one.
        self.owner_id = thread_owner()
        if isinstance(op, Acquire):
            lease = self.acquire_lease(op)
            if lease is False:
                self.history.operation("skipped (known-bug discipline)")
                return
            assert lease is not True
            before = self.top(op.name, op.side)
            read = self.reading(op)
            lock = self.cycled_lock(op.name, op.side) if op.how == "cycle" else None
            sent_at = clock.monotonic()
            try:
                granted = (lock if lock is not None else self.lock(op.name, op.side)).acquire(
                    blocking=op.wait is not None, timeout=op.wait, lease=lease
                )
            except LockUpgradeError:
                self.upgrade_refused(op, read)
                return
            except EXPECTED as failure:
                self.acquire_failed(op.name, op.side, failure)
                return
            finally:
                del lock  # only the reference cycle keeps it now
            at = clock.monotonic()
            if granted:
                self.claim_granted(op, lease, sent_at, at)
            self.acquired(op.name, op.side, before, granted, at)
            self.check_upgrade(op, before, read, granted, at)
        elif isinstance(op, NextUnit):
            self.end_scope()
            leaks.work_ended("request")
            leaks.work_started()
            self.begin_scope(UNIT_SCOPE)
            self.history.operation("unit of work ended")
        elif isinstance(op, Release):
            before_release = self.releasing(op.name, op.side)
            before_claim = self.claim_releasing(op.name, op.side)
            error: BaseException | None = None
            try:
                self.lock(op.name, op.side).release()
            except EXPECTED as caught:
                error = caught
            self.last_release_error = error
            self.claim_released(before_claim, error)
            self.released(op.name, op.side, before_release, error)
        elif isinstance(op, ReportLost):
            for name, side in op.believed:
                self.report_lost(name, side, self.lock(name, side).lost)
        else:
            self._release_all()

    def _release_all(self) -> None:
        config = self.world.config
        for name in config.all_names:
            for side in config.sides(name):
                for _ in range(self.release_tries(name, side)):
                    if not self.holds(name, side):
                        break
                    self._do(Release(name, side))


class TaskOwner(Owner):
    """An owner that is an asyncio task on the world's event loop thread."""

    def __init__(self, label: str, world: World, client_index: int) -> None:
        super().__init__(label, world, client_index)
        loop = world.loop
        self.ops: asyncio.Queue[tuple[Operation, concurrent.futures.Future[None]] | None] = (
            asyncio.run_coroutine_threadsafe(_make_queue(), loop).result(10)
        )
        self.task = asyncio.run_coroutine_threadsafe(self._run(), loop)

    def lock(self, name: str, side: str = "") -> AsyncRLock:
        return self.world.async_lock(name, side)

    def holds(self, name: str, side: str = "") -> list[Hold]:
        lock = self.lock(name, side)
        registry = lock.client.engine.holds
        return registry.holds_of(lock.hold_keys(self.owner_id)[0], self.owner_id)

    def _enqueue(self, op: Operation, done: concurrent.futures.Future[None]) -> None:
        self.world.loop.call_soon_threadsafe(self.ops.put_nowait, (op, done))

    def stop(self) -> None:
        self.world.loop.call_soon_threadsafe(self.ops.put_nowait, None)
        with contextlib.suppress(concurrent.futures.TimeoutError):
            self.task.result(30)

    async def _run(self) -> None:
        self.owner_id = task_owner()
        self.begin_scope(TASK_SCOPE)
        while True:
            item = await self.ops.get()
            if item is None:
                return
            op, done = item
            try:
                await self._do(op)
            except BaseException as error:  # noqa: BLE001 -- handed to whoever waits on it
                done.set_exception(error)
            else:
                done.set_result(None)

    async def _do(self, op: Operation) -> None:
        if isinstance(op, Acquire):
            lease = self.acquire_lease(op)
            if lease is False:
                self.history.operation("skipped (known-bug discipline)")
                return
            assert lease is not True
            before = self.top(op.name, op.side)
            read = self.reading(op)
            sent_at = clock.monotonic()
            try:
                granted = await self._acquire(op, lease)
            except LockUpgradeError:
                self.upgrade_refused(op, read)
                return
            except EXPECTED as failure:
                self.acquire_failed(op.name, op.side, failure)
                return
            at = clock.monotonic()
            if granted:
                self.claim_granted(op, lease, sent_at, at)
            self.acquired(op.name, op.side, before, granted, at)
            self.check_upgrade(op, before, read, granted, at)
        elif isinstance(op, Release):
            before_release = self.releasing(op.name, op.side)
            before_claim = self.claim_releasing(op.name, op.side)
            error: BaseException | None = None
            try:
                await self.lock(op.name, op.side).release()
            except EXPECTED as caught:
                error = caught
            self.last_release_error = error
            self.claim_released(before_claim, error)
            self.released(op.name, op.side, before_release, error)
        elif isinstance(op, ReportLost):
            for name, side in op.believed:
                self.report_lost(name, side, self.lock(name, side).lost)
        else:
            await self._release_all()

    async def _acquire(self, op: Acquire, lease: float | None) -> bool:
        """Ask as ``op.how`` says: the task awaits the grant, however it is wrapped."""
        lock = self.cycled_lock(op.name, op.side) if op.how == "cycle" else None
        call = (lock if lock is not None else self.lock(op.name, op.side)).acquire(
            blocking=op.wait is not None, timeout=op.wait, lease=lease
        )
        del lock  # only the reference cycle (and the call) keeps it now
        if op.how == "wait_for":
            return bool(await asyncio.wait_for(call, BUSY_LIMIT))
        if op.how == "shield":
            return bool(await asyncio.shield(call))
        if op.how == "gather":
            granted, _ = await asyncio.gather(call, asyncio.sleep(0))
            return bool(granted)
        return bool(await call)

    async def _release_all(self) -> None:
        config = self.world.config
        for name in config.all_names:
            for side in config.sides(name):
                for _ in range(self.release_tries(name, side)):
                    if not self.holds(name, side):
                        break
                    await self._do(Release(name, side))


async def _make_queue() -> asyncio.Queue[Any]:
    return asyncio.Queue()


@dataclass
class _Links:
    """One client's proxy and its (replaceable, on ``close``) lock client."""

    proxy: FaultProxy
    sync: LockClient | None = None
    aio: AsyncLockClient | None = None
    #: Lock objects by (name, side); a read-write lock's sides share one object.
    locks: dict[tuple[str, str], Any] = field(default_factory=dict)


class World:
    """A server, one proxy and client per client slot, the owners, and the fault switches."""

    def __init__(self, config: Config, history: History | None = None) -> None:
        self.config = config
        self.history = history or History()
        self.threads_before = {thread.ident for thread in threading.enumerate()}
        # DEBUG SLEEP needs enable-debug-command, an option Redis < 7 does not know.
        debug = ("--enable-debug-command", "yes") if server_major() >= 7 else ()
        self.server = RedisServer(*debug).start()
        self.admin = self.server.client(socket_timeout=10, retry=Retry(NoBackoff(), 3))
        self.operator = LockClient(self.server.url, key_prefix=PREFIX)
        self.loop = asyncio.new_event_loop()
        self.loop_thread = threading.Thread(
            target=self.loop.run_forever, name="model-loop", daemon=True
        )
        self.loop_thread.start()
        self.links = [
            _Links(FaultProxy(self.server.port, lifetime=600)) for _ in range(config.clients)
        ]
        for index in range(config.clients):
            self._connect(index)
        self.owners: list[Owner] = []
        for index in range(config.sync_clients):
            for number in range(config.owners_per_client):
                label = f"thread-{index}.{number}"
                self.owners.append(ThreadOwner(label, self, index))
        for number in range(config.async_owners):
            self.owners.append(TaskOwner(f"task-{number}", self, config.sync_clients))
        for number in range(config.unit_workers):
            index = number % config.sync_clients
            self.owners.append(ThreadOwner(f"worker-{number}", self, index, units=True))
        #: Child processes (Config.processes) and the threads reading what they say.
        self.children: list[tuple[subprocess.Popen[str], threading.Thread]] = []
        self.children_started = 0
        #: What each child wrote on its stderr, once it exited (read by its reader thread).
        self.child_errors: dict[int, str] = {}
        #: When the last full garbage collection ended (see gc_pass).
        self.last_full_gc = 0.0
        self._pauses_stop = threading.Event()
        self._pauses = threading.Thread(target=self._watch_pauses, name="model-pauses", daemon=True)
        self._pauses.start()
        self.closed = False

    def __enter__(self) -> World:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close(check=exc_info[0] is None)

    # -- clients and locks -------------------------------------------------------------

    def _url(self, index: int) -> str:
        seconds = self.config.socket_timeout
        return (
            f"{self.links[index].proxy.url}?socket_timeout={seconds}"
            f"&socket_connect_timeout={seconds}"
        )

    def _connect(self, index: int) -> None:
        links = self.links[index]
        links.locks = {}
        if index < self.config.sync_clients:
            links.sync = self._instrument(
                LockClient(
                    self._url(index),
                    key_prefix=PREFIX,
                    watchdog_timeout=self.config.watchdog_timeout,
                )
            )
        else:
            links.aio = self._run(self._async_client(self._url(index)))
            self._instrument(links.aio.engine)

    async def _async_client(self, url: str) -> AsyncLockClient:
        return AsyncLockClient(
            url, key_prefix=PREFIX, watchdog_timeout=self.config.watchdog_timeout
        )

    def _instrument(self, client: LockClient) -> LockClient:
        """Note when the library starts declaring a hold lost (before the flag is set).

        Also note every acquire reply that grants or re-enters a hold, so a
        violation's report shows the replies its deadline came from.
        """
        # Every loss goes through the registry's declare_lost (the watchdog's, via
        # the client, too): wrapping it on the instance sees them all.
        registry = client.holds
        declare = registry.declare_lost
        history = self.history

        def declare_lost(hold: Hold, reason: str, *, by_owner: bool = False) -> None:
            at = clock.monotonic()
            was_lost = hold.lost
            declare(hold, reason, by_owner=by_owner)
            if hold.lost and not was_lost:
                history.declaring_lost(hold, at)

        registry.declare_lost = declare_lost  # type: ignore[method-assign]
        grant = registry.grant

        def granted(*args: Any, **kwargs: Any) -> Hold:
            hold = grant(*args, **kwargs)
            history.reply(hold, kwargs["sent_at"], kwargs["pttl_ms"], kwargs["holds"])
            return hold

        registry.grant = granted  # type: ignore[method-assign]
        registry.on_leaked(history.leaked)
        return client

    def make_lock(self, client: LockClient | AsyncLockClient, name: str, side: str) -> Any:
        """The object ``client`` takes ``side`` of ``name`` through (the kind's own class).

        Sync and asyncio clients name their factories alike, so this serves both.
        """
        config = self.config
        if name in config.semaphores:
            return client.semaphore(name, config.permits)
        if name in config.rw_names:
            return getattr(client.read_write_lock(name), side)
        return client.fair_lock(name) if config.fair else client.lock(name)

    def sync_lock(self, index: int, name: str, side: str = "") -> RLock:
        links = self.links[index]
        lock = links.locks.get((name, side))
        if lock is None:
            assert links.sync is not None
            lock = links.locks[name, side] = self.make_lock(links.sync, name, side)
        assert isinstance(lock, RLock)
        return lock

    def async_lock(self, name: str, side: str = "") -> AsyncRLock:
        links = self.links[self.config.sync_clients]
        lock = links.locks.get((name, side))
        if lock is None:
            assert links.aio is not None
            lock = links.locks[name, side] = self.make_lock(links.aio, name, side)
        assert isinstance(lock, AsyncRLock)
        return lock

    def _run(self, coroutine: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    # -- operations --------------------------------------------------------------------

    def submit(self, owner: int, op: Operation) -> concurrent.futures.Future[None]:
        """Hand ``op`` to ``owner`` (waiting, bounded, until it finished its previous one)."""
        done = self.owners[owner].submit(op)
        self.history.step(f"{self.owners[owner].label}: {op}")
        return done

    def settle(self) -> None:
        """Wait until every owner is done with what it was given (bounded)."""
        deadline = time.monotonic() + BUSY_LIMIT
        while any(owner.pending for owner in self.owners):
            if time.monotonic() > deadline:
                raise AssertionError(f"owners still busy after {BUSY_LIMIT} s: a call hangs")
            time.sleep(0.01)

    # -- faults ------------------------------------------------------------------------

    def partition(self, index: int, seconds: float) -> None:
        """Cut client ``index`` off for ``seconds`` (its calls and renewals time out)."""
        self.history.fault("partition", f"client {index} for {seconds}s", lasts=seconds)
        proxy = self.links[index].proxy
        proxy.blackhole()
        try:
            time.sleep(seconds)
        finally:
            proxy.heal()

    def stall(self, seconds: float, how: str) -> None:
        """Stop the server answering for ``seconds``: CLIENT PAUSE, or DEBUG SLEEP."""
        self.history.fault(f"stall ({how})", f"{seconds}s", lasts=seconds)
        if how == "pause":
            self.admin.execute_command("CLIENT", "PAUSE", int(seconds * 1000), "ALL")  # type: ignore[no-untyped-call]
            time.sleep(seconds)
        else:
            self.admin.execute_command("DEBUG", "SLEEP", f"{seconds:.3f}")  # type: ignore[no-untyped-call]

    def lose_reply(self, index: int, how: str) -> None:
        """Arm client ``index``'s link: its next script call runs, its reply is lost."""
        # Armed now, it hits whichever call comes next: its moment is not known.
        self.history.fault(f"lost reply ({how})", f"client {index}", lasts=math.inf)
        proxy = self.links[index].proxy
        if how == "drop":
            proxy.drop_reply_after(b"EVALSHA")  # connection reset: the engine resends
        else:
            proxy.swallow_reply_after(b"EVALSHA")  # silence: the call times out

    def client_kill(self, kind: str) -> None:
        """CLIENT KILL every connection of one type (the admin's own is skipped)."""
        self.history.fault(f"client kill ({kind})")
        self.admin.client_kill_filter(_type=kind, skipme=True)

    def force_release(self, name: str) -> None:
        """An operator deletes the lock (every permit, both sides) whoever holds it."""
        self.history.fault("force release", repr(name))
        with self.history.revoking("force release", frozenset({name})):
            if name in self.config.rw_names:
                # The writer first: a reader let in between would not be excused.
                rw = self.operator.read_write_lock(name)
                rw.write.force_release()
                rw.read.force_release()
            else:
                # Each kind's own keys (a fair lock's are not a plain lock's).
                self.make_lock(self.operator, name, "").force_release()

    def flushall(self) -> None:
        self.history.fault("flushall")
        with self.history.revoking("flushall", None):
            self.admin.flushall()

    def restart(self, down_for: float) -> None:
        """SHUTDOWN NOSAVE, ``down_for`` seconds down, start again on the same port."""
        self.history.fault("restart", f"down {down_for}s", lasts=down_for + 1.0)
        process = self.server.process
        assert process is not None
        with self.history.revoking("restart", None):
            with (
                self.server.client(retry=Retry(NoBackoff(), 0)) as admin,
                contextlib.suppress(redis.ConnectionError),
            ):
                admin.shutdown(nosave=True)
            process.wait(10)
            time.sleep(down_for)
            self.server.start()
            self.admin.close()
            self.admin = self.server.client(socket_timeout=10, retry=Retry(NoBackoff(), 3))

    def close_client(self, index: int) -> None:
        """Close client ``index`` with its owners' holds live, check they are told, reconnect."""
        # Reconnecting takes a moment; the margin covers the rest.
        self.history.fault("client closed with live holds", f"client {index}", lasts=1.0)
        self.settle()
        now = clock.monotonic()
        believed: dict[int, tuple[tuple[str, str], ...]] = {}
        for number, owner in enumerate(self.owners):
            if owner.client_index != index:
                continue
            # The library's rule: a hold the watchdog renews is declared lost at
            # close (nothing renews it now); a fixed lease runs on to its deadline
            # and may still be released.
            believed[number] = tuple(
                (name, side)
                for name in self.config.all_names
                for side in self.config.sides(name)
                if (top := owner.top(name, side)) is not None
                and not top.lost
                and now < top.deadline
                and any(hold.watchdog for hold in owner.holds(name, side))
            )
            # A fixed-lease read of the closed client is still the owner's (only
            # watchdog holds are declared lost at close), where its new client
            # knows nothing of it: asking to write is refused as an upgrade
            # until it expires.
            for name in self.config.rw_names:
                if any(not hold.watchdog for hold in owner.holds(name, READ)):
                    owner.unsure_reads[name] = now + self.config.longest_hold + 0.5
        links = self.links[index]
        if links.sync is not None:
            links.sync.close()
        if links.aio is not None:
            self._run(links.aio.aclose())
        for number, names in believed.items():
            if names:
                self.owners[number].submit(ReportLost(names)).result(BUSY_LIMIT)
        self._connect(index)

    # -- the garbage collector and other processes -------------------------------------

    def _watch_pauses(self) -> None:
        """Note each time this process could not run for a third of a watchdog timeout.

        On a loaded machine (or in a long garbage collection) every thread of
        the process may wait that long for a core: the watchdog's renewals are
        late and a hold may expire, as under a stalled server. Such a pause is
        not injected, but it excuses what comes near it as a fault does
        (History.paused); the run's figures count them.
        """
        longest = self.config.watchdog_timeout / 3
        last = time.monotonic()
        while not self._pauses_stop.wait(PAUSE_TICK):
            now = time.monotonic()
            if now - last - PAUSE_TICK > longest:
                self.history.paused(last + PAUSE_TICK, now)
            last = now

    def gc_pass(self, generation: int) -> None:
        """A ``gc.collect(generation)`` on a thread of its own (not a fault: nothing may change).

        A full collection of this process stops every thread for a while
        (about 0.1 s here): passes back to back would starve the watchdog as
        a stalled server does, so a full one comes at most once per watchdog
        timeout, as a real process's would.
        """
        if generation == 2:
            wait = self.last_full_gc + self.config.watchdog_timeout - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        started = time.monotonic()
        thread = threading.Thread(
            target=gc.collect, args=(generation,), name="model-gc", daemon=True
        )
        thread.start()
        thread.join(BUSY_LIMIT)
        took = time.monotonic() - started
        if generation == 2:
            self.last_full_gc = time.monotonic()
        self.history.step(f"gc.collect({generation}) on a thread of its own, {1000 * took:.0f} ms")
        self.history.operation("gc pass")

    def main_thread_returns(self, name: str, works_for: float) -> bool:
        """A child process takes ``name``; its main thread starts a worker thread and returns.

        The child's scope is open until its worker thread (non-daemon: the
        process lives on) says it is done; the child exits only once this
        side has recorded that, so the end recorded is never late. Returns
        whether the child was granted the lock (it waits 0.5 s at most).
        """
        number = len(self.children)
        child = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _CHILD,
                self.server.url,
                PREFIX,
                name,
                str(self.config.watchdog_timeout),
                str(works_for),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None and child.stdin is not None
        first = child.stdout.readline().split()  # bounded: the child's acquire waits 0.5 s
        granted = bool(first) and first[0] == "granted"
        self.history.operation(f"process main thread {first[0] if first else 'failed'}")
        scope: Scope | None = None
        if granted:
            began, sent_at, granted_at = map(float, first[1:4])
            scope = self.history.scope_began(f"process-{number}", PROCESS_SCOPE, at=began)
            self.history.claimed(
                Claim(
                    scope=scope,
                    name=name,
                    kind=LOCK,
                    how="main thread, then returned",
                    sent_at=sent_at,
                    granted_at=granted_at,
                    first_lease=None,
                    lease_end=None,
                    in_process=False,
                )
            )
        self.children_started += 1
        reader = threading.Thread(
            target=self._follow_child, args=(child, scope), name="model-child", daemon=True
        )
        reader.start()
        self.children.append((child, reader))
        return granted

    def _follow_child(self, child: subprocess.Popen[str], scope: Scope | None) -> None:
        """Record the child's scope end as its worker thread says it, then let it exit."""
        assert child.stdout is not None and child.stdin is not None
        assert child.stderr is not None
        for line in child.stdout:
            words = line.split()
            if words and words[0] == "ended":
                if scope is not None:
                    self.history.scope_ended(scope, at=float(words[1]))
                with contextlib.suppress(OSError):
                    child.stdin.write("recorded\n")
                    child.stdin.flush()
        # Its stdout closed: it has exited, or is about to (a few lines at most on stderr).
        self.child_errors[child.pid] = child.stderr.read()

    def _wait_for_children(self) -> None:
        """Every child exited (bounded): its holds ended with it."""
        for child, reader in self.children:
            try:
                child.wait(BUSY_LIMIT)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(10)
                self.history.violated(LEAK, f"a child process still ran after {BUSY_LIMIT} s")
            reader.join(10)
            if child.returncode:
                errors = self.child_errors.get(child.pid, "")
                self.history.violated(
                    LEAK, f"a child process failed ({child.returncode}): {errors[-2000:]}"
                )
        self.children = []

    # -- checks ------------------------------------------------------------------------

    def check(self) -> None:
        """Raise the first violation found so far (see :mod:`tests.model.history`)."""
        self.history.check_overlaps()
        self.history.check_tokens()
        self.history.check_ownership(self.config.margin)
        if self.config.semaphores:
            self.history.check_permits(self.config.permits)
        self.history.raise_first()

    def close(self, *, check: bool = True) -> None:
        """Release everything, check nothing grew, and stop every part (always)."""
        if self.closed:
            return
        self.closed = True
        try:
            for links in self.links:
                links.proxy.heal()
            try:
                self.settle()
                releases = [(owner, owner.submit(ReleaseAll())) for owner in self.owners]
                self.settle()
                self._wait_for_children()
            except AssertionError:
                if check:
                    raise
            else:
                # An owner whose last releases ended in an error nobody expects
                # would leave its holds to the leak check: say what it was.
                for owner, done in releases:
                    if done.done() and (error := done.exception()) is not None:
                        self.history.violated(
                            LEAK,
                            f"{owner.label}'s releases at the end failed: {error!r}",
                        )
            if check:
                self.check()
                self._check_nothing_grew_while_open()
            self._stop_owners_and_clients()
            if check:
                self._check_nothing_left_on_the_server()
        finally:
            self._stop_owners_and_clients()
            for child, reader in self.children:
                child.kill()
                child.wait(10)
                reader.join(10)
            self._stop_the_rest()
        if check:
            self._check_no_thread_left()

    def _stop_owners_and_clients(self) -> None:
        for owner in self.owners:
            if isinstance(owner, ThreadOwner | TaskOwner):
                owner.stop()
        self.owners = []
        for links in self.links:
            if links.sync is not None:
                links.sync.close()
                links.sync = None
            if links.aio is not None:
                with contextlib.suppress(Exception):
                    self._run(links.aio.aclose())
                links.aio = None
        self.operator.close()

    def _stop_the_rest(self) -> None:
        self._pauses_stop.set()
        self._pauses.join(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.loop_thread.join(10)
        if not self.loop.is_running():
            self.loop.close()
        for links in self.links:
            links.proxy.close()
        self.admin.close()
        self.server.__exit__(None, None, None)

    def _check_nothing_grew_while_open(self) -> None:
        """After every release: no lock left, keys and channels bounded by names and owners."""
        config = self.config
        names = set(config.names)
        keys = [
            fair_keys(PREFIX, name) if config.fair else LockKeys.build(PREFIX, name)
            for name in names
        ]
        hashes = {key.hash for key in keys}
        # A fair lock's queue is a waiting set too.
        waiters = {key.waiters for key in keys} | {
            key.queue for key in keys if isinstance(key, FairKeys)
        }
        # Keys holding holds that must expire: a semaphore's permit hashes, a reader's key.
        per_owner: list[str] = []
        # Index sets that may outlive their dead members, each with its bound.
        indexes: dict[str, int] = {}
        # A fencing counter per name and a request latch per owner and name at most.
        bound = len(names) * (1 + config.owners)
        # Each thread that ended and each child process was an owner id of its own.
        bound += len(names) * (self.history.operations["thread ended"] + self.children_started)
        for name in config.semaphores:
            semaphore = semaphore_keys(PREFIX, name)
            waiters.add(semaphore.waiters)
            per_owner.append(permit_prefix(semaphore))
            indexes[semaphore.hash] = config.permits
            bound += 1 + config.owners  # the index, a latch per owner
        for name in config.rw_names:
            rw = RWKeys.build(PREFIX, name)
            hashes.add(rw.write)
            waiters.add(rw.waiters)
            per_owner.append(rw.reader_prefix)
            indexes[rw.readers] = config.owners
            bound += 2 + 2 * config.owners  # fence, readers index, read and write latches

        def holding_keys() -> set[str]:
            found = {_text(key) for key in self.admin.keys(f"{PREFIX}:*")}
            return (found & (hashes | waiters)) | {
                key for key in found if key.startswith(tuple(per_owner))
            }

        # Grants whose reply was lost, and holds of a failed release, expire unrenewed.
        left = _eventually(
            holding_keys, seconds=config.longest_hold + 2 * config.socket_timeout + 2
        )
        if left:
            self.history.violated(
                LEAK,
                f"locks or waiting sets still there after expiry: {self._describe_keys(left)}; "
                f"holds the owners' clients know of: {self._known_holds()}",
            )
        for index, most in indexes.items():
            members = int(self.admin.scard(index))
            if members > most:
                self.history.violated(LEAK, f"{index} has {members} members (bound {most})")
        size = int(self.admin.dbsize())
        if size > bound:
            self.history.violated(LEAK, f"{size} keys after every hold ended (bound {bound})")
        channels = self.admin.pubsub_channels()
        if len(channels) > len(config.all_names):
            self.history.violated(LEAK, f"{len(channels)} channels subscribed: {channels}")
        self.history.raise_first()

    def _describe_keys(self, keys: set[str]) -> dict[str, str]:
        """Each key's type, PTTL and (for a hash) fields, for a leak's report."""
        described = {}
        for key in sorted(keys):
            kind = _text(self.admin.type(key))
            fields = self.admin.hgetall(key) if kind == "hash" else {}
            content = {_text(field): _text(value) for field, value in fields.items()}
            described[key] = f"{kind} pttl {self.admin.pttl(key)} {content}"
        return described

    def _known_holds(self) -> list[str]:
        """Every hold still in an owner's registry: whose, on which key, its state.

        With how the owner's last release ended: the end-of-run releases stop
        after one try per hold and :data:`RELEASE_RETRIES` more, so a hold left
        there while releases kept failing (a server too slow for the model's
        short socket timeout) says so.
        """
        known = [f"{owner.label} is {owner.owner_id}" for owner in self.owners]
        for owner in self.owners:
            for name in self.config.all_names:
                for side in self.config.sides(name):
                    known += [
                        f"{owner.label} {hold.key} count {hold.count} lost {hold.lost} "
                        f"watchdog {hold.watchdog}, its last release: "
                        f"{owner.last_release_error!r}"
                        for hold in owner.holds(name, side)
                    ]
        return known

    def _check_nothing_left_on_the_server(self) -> None:
        """Every client closed: the admin's is the only connection, no channel is left."""
        others = _eventually(lambda: len(self.admin.client_list()) - 1, seconds=5)
        if others:
            self.history.violated(
                LEAK,
                f"{others} connections left after every client closed: "
                f"{[(c['addr'], c['cmd'], c['age']) for c in self.admin.client_list()]}",
            )
        channels = _eventually(lambda: len(self.admin.pubsub_channels()), seconds=5)
        if channels:
            self.history.violated(LEAK, f"{channels} channels left after every client closed")
        self.history.raise_first()

    def _check_no_thread_left(self) -> None:
        """No thread of this run is left (the process's one watchdog thread may stay)."""
        left = _eventually(
            lambda: [
                thread.name
                for thread in threading.enumerate()
                if thread.ident not in self.threads_before and thread.name != "rlock-watchdog"
            ],
            seconds=5,
        )
        if left:
            self.history.violated(LEAK, f"threads left behind: {left}")
        self.history.raise_first()


#: The child process of World.main_thread_returns: argv is the server's URL, the key
#: prefix, the name, the watchdog timeout, and how long its worker thread works.
_CHILD = """
import sys, threading, time
from django_rlock.core import LockClient

url, prefix, name, timeout, works_for = sys.argv[1:6]
began = time.monotonic()
lock = LockClient(url, key_prefix=prefix, watchdog_timeout=float(timeout)).lock(name)
sent = time.monotonic()
granted = lock.acquire(timeout=0.5)
print("granted" if granted else "refused", began, sent, time.monotonic(), flush=True)

def work():
    time.sleep(float(works_for))
    print("ended", time.monotonic(), flush=True)
    sys.stdin.readline()  # until the model has recorded the end

if granted:
    threading.Thread(target=work).start()
"""


def _eventually(measure: Callable[[], T], seconds: float) -> T:
    """``measure()`` once it is falsy (nothing left), or its last value after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        value = measure()
        if not value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def _text(reply: bytes | str) -> str:
    return reply.decode() if isinstance(reply, bytes) else reply
