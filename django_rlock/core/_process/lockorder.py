"""The lock order check: inversions seen before they deadlock (Linux's lockdep, for Redis locks).

Two owners that take the same two locks in opposite orders deadlock as soon as
they run at the same time; on a quiet test run or a staging server they rarely
do. The check sees the danger on the first run instead: each process records,
for every new hold, which locks its owner (a thread or an asyncio task) already
held, as edges ``held -> taken`` of one graph per process. An edge that closes
a cycle (``order`` before ``customer`` seen once, ``customer`` before ``order``
now; or any longer cycle, A before B, B before C, then C before A) is an order
that can deadlock, whether or not it did: a :class:`~django_rlock.core.LockOrderWarning`
names every edge of the cycle with the call sites that took its two locks.

The graph's nodes are lock *classes*, as lockdep's are: a lock's key template
(``order:{order_id}``, known for ``@locked``, for ``rlock(template, **fields)``
and for Celery's locked tasks: ``key_template`` on the lock), else its full
name. Two locks of one class (``order:1`` then ``order:2``) are lockdep's
"nested" case: no edge and no warning, since the check cannot tell a
consistent order among the ids (by id, say) from an inverted one.

Each cycle is reported once per process, when the edge that closes it is
first seen. Memory is bounded: the graph keeps at most :data:`MAX_EDGES`
edges (then stops learning new ones, says so once, and still tells an
inversion of the orders it knows), and a hold's call site is kept only as
long as the hold. Off (the default),
nothing here runs: a client subscribes the check to its hold registry's
``on_acquired`` event only when asked (``LockClient(lock_order_check=True)``,
``RLOCK_LOCK_ORDER_CHECK``).

The warning goes through :mod:`warnings`, attributed to the inverted call
site, so the usual filters decide what becomes of it. A filter that turns it
into an error (``-W error::django_rlock.LockOrderWarning``) cannot raise it
where it is found: the lock is granted by then, and an error out of
``acquire()`` would leave it held with no ``with`` block to give it back. The
error is kept instead (:meth:`LockOrder.raised_since`) and logged; the pytest plugin
(:mod:`django_rlock.testing`) fails the test that took the inverted order with it.
"""

from __future__ import annotations

import logging
import os
import sys
import sysconfig
import threading
import warnings
import weakref
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Final

from django_rlock.core._process import forking
from django_rlock.core._process.kept import HoldKeeper, KeptHold
from django_rlock.core.exceptions import LockOrderWarning

logger = logging.getLogger("django_rlock.lock")

#: The most edges the graph keeps. Each is two lock classes and two call sites
#: (a few hundred bytes): a few MB at most. Past it, new orders are not learnt.
MAX_EDGES: Final = 10_000

#: The most errors kept for :meth:`LockOrder.raised_since` (a filter made the warning an error).
MAX_RAISED: Final = 100

# Frames from these directories are the machinery between the user's code and
# the lock (this package, its Celery face, the standard library's contextlib,
# threading, asyncio): a call site is the first frame outside them.
_PACKAGES = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
_MACHINERY: Final = (
    os.path.join(_PACKAGES, "django_rlock") + os.sep,
    os.path.join(_PACKAGES, "celery_rlock") + os.sep,
    sysconfig.get_paths()["stdlib"] + os.sep,
)


@dataclass(frozen=True)
class Site:
    """Where user code took a lock: the nearest frame outside the lock machinery."""

    filename: str
    lineno: int
    function: str
    #: The module's ``__name__`` (what a warning filter's module pattern matches).
    module: str = "?"

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno} in {self.function}"


#: A site the stack could not tell (every frame was machinery).
UNKNOWN_SITE: Final = Site("<unknown>", 0, "?")


@dataclass(frozen=True)
class Edge:
    """``taken`` was taken while ``held`` was held: the first time this process saw it."""

    held: str
    taken: str
    #: Where the owner had taken ``held``.
    held_at: Site
    #: Where it then took ``taken``.
    taken_at: Site

    def describe(self) -> str:
        """One line of a report: the two classes and both call sites."""
        held = f"{self.held!r} (taken at {self.held_at})"
        return f"{held} then {self.taken!r} (taken at {self.taken_at})"


#: The group of locks being taken all at once by the current thread or task, if any.
_together: ContextVar[object | None] = ContextVar("rlock_taken_together", default=None)


@contextmanager
def taken_together() -> Iterator[None]:
    """Around locks taken all at once (a MultiLock's members): no order among them.

    A MultiLock takes its members in turn but gives back those it took when
    one stays busy, so two MultiLocks of the same locks in opposite orders
    cannot deadlock: no edge is learnt between two members. Locks held before
    it still come before each member (waiting for a member while holding
    them can deadlock).
    """
    token = _together.set(object())
    try:
        yield
    finally:
        _together.reset(token)


def check_lock_order_check(value: object) -> bool:
    """``lock_order_check`` / ``LOCK_ORDER_CHECK``: True or False; ValueError otherwise."""
    if not isinstance(value, bool):
        raise ValueError(f"lock_order_check must be True or False, got {value!r}")
    return value


def call_site() -> Site:
    """The nearest caller outside the lock machinery (on the acquiring thread or task)."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if not code.co_filename.startswith(_MACHINERY):
            module = frame.f_globals.get("__name__", "?")
            return Site(code.co_filename, frame.f_lineno, code.co_name, str(module))
        frame = frame.f_back  # type: ignore[assignment]  # None ends the loop
    return UNKNOWN_SITE


def lock_class(hold: KeptHold) -> str:
    """The lock class of ``hold``: its lock's key template if known, else its name."""
    for lock in hold.locks:
        if lock.key_template is not None:
            return lock.key_template
    return hold.name


def report(cycle: list[Edge]) -> LockOrderWarning:
    """The warning for ``cycle``, whose first edge is the one just seen."""
    new, *earlier = cycle
    lines = [
        f"lock order inversion: {new.taken!r} was taken while holding {new.held!r}, "
        "but the opposite order was seen before in this process; owners taking "
        "these locks at the same time can deadlock.",
        f"  now:     {new.describe()}",
        *(f"  earlier: {edge.describe()}" for edge in earlier),
        "Take locks in one global order (see docs/deadlocks.md).",
    ]
    return LockOrderWarning("\n".join(lines), cycle=tuple(cycle))


class LockOrder:
    """One process's graph of lock orders, and the registries it watches.

    Thread-safe (one mutex, never held while warning). Fed by the
    ``on_acquired`` event of each watched :class:`HoldRegistry`, on the
    acquiring thread or task, once per new hold (a re-entry is none).
    """

    def __init__(self, max_edges: int = MAX_EDGES) -> None:
        self._mutex = threading.Lock()
        self.max_edges = max_edges
        #: held class -> taken class -> the first edge seen between them.
        self._after: dict[str, dict[str, Edge]] = {}
        self.edges = 0
        self._full = False
        #: Inversions told while the graph was full (their edges not kept).
        self._told: set[tuple[str, str]] = set()
        #: The registries watched, weakly (a closed client's registry may go).
        self._watched: tuple[weakref.ref[HoldKeeper], ...] = ()
        #: Each watched hold's class, call site and group (:func:`taken_together`),
        #: for as long as the hold lives.
        self._taken: weakref.WeakKeyDictionary[KeptHold, tuple[str, Site, object | None]] = (
            weakref.WeakKeyDictionary()
        )
        #: Every warning a filter turned into an error, numbered from 1.
        self._raised: deque[tuple[int, LockOrderWarning]] = deque(maxlen=MAX_RAISED)
        self._raised_count = 0

    def watch(self, registry: HoldKeeper) -> None:
        """Check the order of every hold ``registry`` grants from now on (once per registry)."""
        with self._mutex:
            alive = tuple(ref for ref in self._watched if ref() is not None)
            if any(ref() is registry for ref in alive):
                return
            self._watched = (*alive, weakref.ref(registry))
        registry.on_acquired(self.acquired)

    def acquired(self, hold: KeptHold) -> None:
        """A new hold was granted: learn its owner's order, and warn about a cycle it closes."""
        site = call_site()
        taken = lock_class(hold)
        held = []
        for ref in self._watched:
            registry = ref()
            if registry is not None:
                held += registry.holds_owned_by(hold.owner)
        group = _together.get()
        cycles: list[list[Edge]] = []
        with self._mutex:
            self._taken[hold] = (taken, site, group)
            for other in held:
                known = self._taken.get(other) if other is not hold else None
                if known is None or known[0] == taken:  # not watched; or nested: one class
                    continue
                held_class, held_at, held_group = known
                if group is not None and held_group is group:  # one MultiLock's members
                    continue
                cycle = self._learn(Edge(held_class, taken, held_at, site))
                if cycle is not None:
                    cycles.append(cycle)
        for cycle in cycles:
            self._warn(report(cycle))

    def _learn(self, edge: Edge) -> list[Edge] | None:
        # With the mutex held: keep a new order, and return the cycle it closes
        # (``edge`` first), if it closes one that was not told yet.
        after = self._after.setdefault(edge.held, {})
        if edge.taken in after:
            return None
        full = self.edges >= self.max_edges
        if not full:
            after[edge.taken] = edge
            self.edges += 1
        else:
            # Full: the known orders are still checked against, and an
            # inversion of them told once (the tellings bounded alike).
            self._say_full()
            pair = (edge.held, edge.taken)
            if pair in self._told or len(self._told) >= self.max_edges:
                return None
        path = self._path(edge.taken, edge.held)
        if path is None:
            return None
        if full:
            self._told.add((edge.held, edge.taken))
        return [edge, *path]

    def _path(self, start: str, goal: str) -> list[Edge] | None:
        # With the mutex held: edges leading from ``start`` to ``goal``, shortest
        # first (breadth-first, each class visited once), or None.
        came_by: dict[str, Edge | None] = {start: None}
        frontier = deque([start])
        while frontier:
            node = frontier.popleft()
            for edge in self._after.get(node, {}).values():
                if edge.taken in came_by:
                    continue
                came_by[edge.taken] = edge
                if edge.taken == goal:
                    path: list[Edge] = []
                    step: Edge | None = edge
                    while step is not None:
                        path.append(step)
                        step = came_by[step.held]
                    return path[::-1]
                frontier.append(edge.taken)
        return None

    def _say_full(self) -> None:
        # With the mutex held.
        if not self._full:
            self._full = True
            logger.warning(
                "lock order check: %d lock orders recorded, the most kept; new orders are "
                "no longer checked in this process",
                self.max_edges,
            )

    def _warn(self, warning: LockOrderWarning) -> None:
        site = warning.cycle[0].taken_at
        try:
            warnings.warn_explicit(
                warning, LockOrderWarning, site.filename, site.lineno, module=site.module
            )
        except LockOrderWarning as error:
            # A filter made it an error: not raised here, where the lock is
            # already granted (see the module's docstring).
            logger.error("%s", error)
            with self._mutex:
                self._raised_count += 1
                self._raised.append((self._raised_count, error))

    def raised_mark(self) -> int:
        """A mark for :meth:`raised_since`: how many errors were kept so far."""
        with self._mutex:
            return self._raised_count

    def raised_since(self, mark: int) -> list[LockOrderWarning]:
        """The warnings a filter turned into errors after ``mark`` (the newest kept)."""
        with self._mutex:
            return [error for number, error in self._raised if number > mark]

    def reset(self) -> None:
        """Forget every order learnt (the watched registries stay watched)."""
        with self._mutex:
            self._after = {}
            self.edges = 0
            self._full = False
            self._told = set()
            self._raised.clear()

    def after_fork(self) -> None:
        """In a forked child: a new mutex; the orders learnt stay true for its code."""
        self._mutex = threading.Lock()


#: The process's one graph.
lock_order = LockOrder()


@forking.after_fork_in_child
def _renew_after_fork() -> None:
    lock_order.after_fork()
