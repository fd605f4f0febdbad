"""Deadlock detection for the plain lock, without I/O: the wait-for graph and its cycles.

A waiter that has waited ``deadlock_timeout`` seconds (see
:class:`~django_rlock.core._protocol.plan.AcquirePlan`) records what it waits
for, then looks for a cycle through itself; the sync and asyncio shells
(``_sync/locks.py``, ``_aio/locks.py``) send the reads this module asks for.

The graph lives in Redis, in plain keys:

* a **wait edge** per waiting owner, ``<prefix>:waits:<owner>`` (STRING):
  ``<started ms> <call id> <incarnation> <lock hash key>``: the lock it waits
  for, and which acquire call waits. Written once the call has waited
  ``deadlock_timeout``, given a short life (:func:`edge_life`) which each check
  renews with PEXPIRE, deleted when the call ends. An edge that expired while
  its call still waits is written anew with a new incarnation, never revived
  by PEXPIRE: one value is one unbroken stretch of the key's life.
* a lock's **holder**: the owner field of its hash (the hash's other fields,
  ``~holder`` and ``~since``, say who that is, for the error's message), and
  its **grant**: the fencing counter, a new value at every new grant.

The owner ids in these keys are credentials, as they are in the lock hashes:
they never appear in a message or a log line.

The walk. From the caller's lock: read the lock's holder and grant (one
script, both keys in the lock's slot, read at one instant), then the holder's
wait edge (GET), then that lock's holder, and so on, at most
:data:`MAX_CYCLE` locks. A plain lock has one holder, so the walk is a path:
it ends when a lock is free, a holder does not wait, or it comes back to the
caller (a candidate cycle) or to another owner it has passed (a cycle the
caller only waits on: one of its members breaks it). Every read is of one key
(or one slot), so it runs on Redis Cluster as on one server.

Exactness. A candidate cycle is confirmed by a second walk, after the first:
every reading the same. Each reading is of a value that, once gone, never
comes back: an edge's incarnation is unique to one stretch of its call's
wait, a grant's token to one grant (tokens strictly increase per name). So a
value read equal at two moments was there all along in between, and at any
instant between the end of the first walk and the start of the second every
edge and every grant of the cycle held at once: each member was waiting, in
the same acquire call, for a lock held, under the same grant, by the next.
None of them could move, so no member's wait could ever end: a deadlock, not
an artefact of reading edges at different times. The two walks cost
``4n`` reads for a cycle of ``n`` locks.

One victim. Every member of a cycle computes the same victim from the same
edges: the member whose acquire call began last (its edge's start time, then
its call id, compared as they are stored, so every process agrees whatever
its clock), which is usually the one whose wait closed the cycle. Only the
victim raises :class:`~django_rlock.core.exceptions.DeadlockError`; the others
find the same cycle and wait on, and get their locks once the victim's code
releases its holds. The start time and call id of an edge are those of the
call, not of its incarnation, so a rewritten edge never changes the victim.

What is left out: the fair lock, the read-write lock, the semaphore and the
Redisson layout do not check (their waits never write an edge, and a walk
that meets one of their keys finds no plain grant and stops), nor do locks
on different Redis deployments. An edge whose deletion failed (Redis
unreachable as the wait ended) stays until its life ends.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django_rlock.core._process.holder import holder_line, is_holder_field, read_holder
from django_rlock.core._protocol import clock
from django_rlock.core._protocol.calls import ScriptCall
from django_rlock.core._protocol.lock import MakeScript, ScriptSet
from django_rlock.core._protocol.names import LockKeys, milliseconds
from django_rlock.core.exceptions import DeadlockError

#: The most locks a walk follows: a longer cycle is not looked for.
MAX_CYCLE = 64


#: The shortest life of a wait edge, in seconds (see :func:`edge_life`).
MIN_EDGE_LIFE = 2.0


# KEYS[1] lock hash, KEYS[2] its fencing counter
# Returns {token or nil, {field, value, ...}}: the lock's grant and its hash,
# read at one instant (the walk must never pair a holder with another grant's token).
# The plain lock keeps its token in its hash ('~t'); a sibling kind (and a
# plain lock an older version granted) in the counter.
READ_HOLD = """
local token = redis.call('hget', KEYS[1], '~t') or redis.call('get', KEYS[2])
return {token, redis.call('hgetall', KEYS[1])}
"""


class DeadlockScripts(ScriptSet):
    """The detector's one script (a read: it may run when Redis is out of memory)."""

    def register(self, plain: MakeScript, oom_safe: MakeScript) -> None:
        """Make the script."""
        self.read_hold = plain(READ_HOLD)


def read_hold_call(lock: str) -> ScriptCall:
    """The READ_HOLD call of the lock whose hash key is ``lock``."""
    return ScriptCall(keys=[lock, LockKeys.around("", lock).fence], args=[])


def check_deadlock_timeout(value: object) -> float | None:
    """``deadlock_timeout``: None (no detection) or seconds > 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(
            f"deadlock_timeout must be a number of seconds or None, not {type(value).__name__}"
        )
    if not (0 < value < math.inf):
        raise ValueError(f"deadlock_timeout must be > 0 seconds or None (off), got {value!r}")
    return float(value)


def edge_key(prefix: str, owner: str) -> str:
    """The wait edge key of ``owner`` (never a lock's key: those have a brace after the prefix)."""
    return f"{prefix}:waits:{owner}" if prefix else f"waits:{owner}"


def edge_life(deadlock_timeout: float) -> float:
    """How long an edge lives past its last renewal, in seconds.

    Each check renews it, every ``deadlock_timeout``: three intervals, at least
    :data:`MIN_EDGE_LIFE`, so a waiter whose check is late keeps its edge.
    """
    return max(3 * deadlock_timeout, MIN_EDGE_LIFE)


@dataclass(frozen=True, slots=True)
class Edge:
    """A wait edge as stored: which acquire call waits, since when, for which lock."""

    started_ms: int
    call_id: str
    incarnation: int
    lock: str

    def encode(self) -> str:
        """The stored value (the lock key last: it may hold spaces)."""
        return f"{self.started_ms} {self.call_id} {self.incarnation} {self.lock}"

    @classmethod
    def decode(cls, raw: object) -> Edge | None:
        """The edge a stored value holds; None when it is missing or not an edge."""
        if isinstance(raw, bytes):
            raw = raw.decode("utf-8", "replace")
        if not isinstance(raw, str):
            return None
        parts = raw.split(" ", 3)
        if len(parts) != 4 or not parts[0].isdigit() or not parts[2].isdigit():
            return None
        return cls(int(parts[0]), parts[1], int(parts[2]), parts[3])

    @property
    def rank(self) -> tuple[int, str]:
        """The victim rule's order: the call that began last ranks highest."""
        return (self.started_ms, self.call_id)


@dataclass(frozen=True, slots=True)
class Link:
    """One lock of a cycle: its hash key and who holds it (as an operator sees it)."""

    lock: str
    holder: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class Cycle:
    """A cycle a walk found: its locks from the caller's, the members' edges, the readings."""

    links: tuple[Link, ...]
    #: The edges of the other members (the caller's own is the detector's).
    edges: tuple[Edge, ...]
    #: Every reply the walk read, in order: the second walk must read the same.
    readings: tuple[Any, ...] = field(repr=False)


#: A read the walk asks the shell for: ``("hold", hash key)`` -> the reply of
#: its :func:`read_hold_call`; ``("edge", key)`` -> the GET reply.
Read = tuple[str, ...]


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _fields(flat: Sequence[Any]) -> dict[str, str]:
    return {_text(flat[i]): _text(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}


def walk(prefix: str, owner: str, lock: str) -> Generator[Read, Any, Cycle | None]:
    """Follow the wait-for path from ``owner``, waiting for the lock hash ``lock``.

    Yields the reads (see :data:`Read`) and returns the cycle back to
    ``owner``, or None when the path ends elsewhere.
    """
    readings: list[Any] = []
    links: list[Link] = []
    edges: list[Edge] = []
    seen = {owner}
    for _ in range(MAX_CYCLE):
        reply = yield ("hold", lock)
        readings.append(reply)
        token, flat = (reply[0], reply[1]) if isinstance(reply, list | tuple) else (None, [])
        fields = _fields(flat or [])
        holders = [name for name in fields if not is_holder_field(name)]
        if token is None or len(holders) != 1:
            return None  # free, or not a plain lock's grant
        holder = holders[0]
        links.append(Link(lock, read_holder(fields)))
        if holder == owner:
            # Never a lock the caller itself holds (a re-entry is granted at once).
            return Cycle(tuple(links), tuple(edges), tuple(readings)) if edges else None
        if holder in seen:
            return None  # a cycle the caller waits on, but is not part of
        seen.add(holder)
        raw = yield ("edge", edge_key(prefix, holder))
        readings.append(raw)
        edge = Edge.decode(raw)
        if edge is None:
            return None  # the holder does not wait (for long)
        edges.append(edge)
        lock = edge.lock
    return None


class Detector:
    """One acquire call's side of detection: its edge, and what a confirmed cycle means.

    Made on the call's first check, so a call that never waits that long
    costs nothing.
    """

    def __init__(
        self, prefix: str, owner: str, lock: str, deadlock_timeout: float, started: float
    ) -> None:
        self.prefix, self.owner, self.lock = prefix, owner, lock
        self.key = edge_key(prefix, owner)
        self.life_ms = milliseconds(edge_life(deadlock_timeout))
        # The call's start (``started``, monotonic) on the wall clock: compared
        # across processes only as stored, so a skewed clock may pick another
        # victim, never two.
        began = time.time() - (clock.monotonic() - started)
        self._edge = Edge(int(began * 1000), secrets.token_hex(8), 0, lock)
        #: Whether the edge may have been written (then it is deleted as the call ends).
        self.written = False

    def edge_value(self) -> str:
        """The value to write: the first incarnation, or a new one once one was written."""
        if self.written:
            edge = self._edge
            self._edge = Edge(edge.started_ms, edge.call_id, edge.incarnation + 1, edge.lock)
        return self._edge.encode()

    def walk(self) -> Generator[Read, Any, Cycle | None]:
        """The walk from this call (see :func:`walk`)."""
        return walk(self.prefix, self.owner, self.lock)

    def is_victim(self, cycle: Cycle) -> bool:
        """Whether this call is the one of ``cycle`` that must give up."""
        own = self._edge.rank
        return all(edge.rank < own for edge in cycle.edges)


def describe_holder(holder: Mapping[str, Any] | None) -> str:
    """A holder as a message shows it (:func:`~django_rlock.core._process.holder.holder_line`)."""
    return holder_line(holder)


def deadlock_message(prefix: str, cycle: Cycle, waited: float) -> str:
    """The victim's :class:`DeadlockError` message: every lock of the cycle and its holder."""
    steps = []
    for link in cycle.links:
        name = LockKeys.name_of(prefix, link.lock) or link.lock
        steps.append(f"lock {name!r} held by {describe_holder(link.holder)}")
    first = LockKeys.name_of(prefix, cycle.links[0].lock) or cycle.links[0].lock
    return (
        f"deadlock detected after waiting {waited:.3f}s for lock {first!r}: this caller waits "
        f"for {', which waits for '.join(steps)} (this caller). This acquire gave up to break "
        "the cycle (its call began last); release the locks it holds and retry, or take "
        "locks in one global order"
    )


def cycle_entries(prefix: str, cycle: Cycle) -> tuple[dict[str, Any], ...]:
    """:attr:`DeadlockError.cycle`: each lock's name and holder."""
    return tuple(
        {"lock": LockKeys.name_of(prefix, link.lock) or link.lock, "holder": link.holder}
        for link in cycle.links
    )


def deadlock_error(prefix: str, name: str, cycle: Cycle, started: float) -> DeadlockError:
    """The victim's error for ``cycle``, found by its call on lock ``name`` begun at ``started``."""
    return DeadlockError(
        deadlock_message(prefix, cycle, clock.monotonic() - started),
        name=name,
        cycle=cycle_entries(prefix, cycle),
    )
