"""Deadlock detection for every lock kind, without I/O: the wait-for graph and its deadlocks.

A waiter that has waited ``deadlock_timeout`` seconds (see
:class:`~django_rlock.core._protocol.plan.AcquirePlan`) records what it waits
for, then looks for a deadlock through itself; the sync and asyncio shells
(``_check_deadlock`` in ``_sync/locks.py``, ``_aio/locks.py``) send the reads
this module asks for (:meth:`Detector.check`).

The graph lives in Redis, in plain keys:

* a **wait edge** per waiting owner, ``<prefix>:waits:<owner>`` (STRING):
  ``<started ms> <call id> <incarnation> <what> <key>``: what it waits for
  (:class:`Wait`: a lock, a fair lock, the read or the write side of a
  read-write lock, a permit of a semaphore of ``N`` permits, a lock in
  Redisson's layout) and which acquire call waits. Written once the call has
  waited ``deadlock_timeout``, given a short life (:func:`edge_life`) which
  each check renews with PEXPIRE, deleted when the call ends. An edge that
  expired while its call still waits is written anew with a new incarnation,
  never revived by PEXPIRE: one value is one unbroken stretch of the key's life.
* who **holds** what: a lock's (or fair lock's) hash names its one holder
  (its other fields, ``~holder``, ``~task`` and ``~since``, say who that is); a
  read-write lock's write hash its writer, its readers index and read keys
  the readers; a semaphore's index and permit hashes each holder and its
  permits. One read-only script per kind reads all of one name at one
  instant (every key of a name shares its slot).

The owner ids in these keys are credentials, as they are in the lock hashes:
they never appear in a message or a log line.

Who blocks whom (a waiter's **blockers**):

* a lock, a fair lock, a Redisson-layout lock: its one holder. A fair lock's
  queue adds no blocker: everyone queued waits for the same holder, so a
  deadlock through the queue always runs through the holder too.
* the write side of a read-write lock: the writer, or, when nobody writes,
  every reader. It needs them all gone, so it is stuck if any one is.
* the read side: the writer (another owner's; a writer may read).
* a semaphore: every holder, the waiter too when it holds permits already
  (a permit is not re-entrant). It needs one permit: it is stuck only if the
  permits held by stuck owners alone fill the semaphore (``N``, as the
  waiter counts them), i.e. no holder that could go on holds enough to let
  it in when it releases.

The search. From the caller, breadth first, at most :data:`MAX_CYCLE` names
and :data:`MAX_OWNERS` edges: read what the caller waits for, then each
blocker's edge, what that one waits for, and so on. A blocker without an
edge does not wait (for long): it runs, and will release. Then, as a
database's deadlock detector reduces its wait-for graph, the **stuck** set:
start from every waiter read, and drop any whose blockers let it go on
(one is not stuck, for a lock; the permits of those not stuck would let it
in, for a semaphore), until nothing changes. What is left can never go on
without a victim. The caller is part of a deadlock only if it is stuck *and*
on a cycle of stuck owners (its strongly connected component), and that
component is stuck on its own (reduced again with everyone outside it free
to go on): a caller that only waits behind a deadlock, or whose semaphore a
deadlock elsewhere will free, waits for that deadlock's own victim. Every
read is of one key or one slot, so the search runs on Redis Cluster as on
one server.

Exactness. A candidate is confirmed by a second search, after the first:
every reading the same. An edge's incarnation is unique to one stretch of its
call's wait, so an edge read equal twice was there all along, its owner in the
same acquire call, unable to release anything. A hold counted in a reading
can only be granted again to its own owner (by an acquire call of its own):
so a stuck member's holds read equal twice were held all along too (a lock's
grant also carries its fencing token, a writer's hash, a read key and a
permit hash their ``~since``). So at any instant between the two searches every member of the
deadlock waited, in the same call, for what stuck members held: none could
ever move. The two searches cost twice the reads of one.

One victim. Every member of a deadlock finds the same component and the same
members, and picks the same victim from their edges: the member whose acquire
call began last (its edge's start time, then its call id, compared as they
are stored, so every process agrees whatever its clock), usually the one
whose wait closed the cycle. Only the victim raises
:class:`~django_rlock.core.exceptions.DeadlockError`; the others find the same
deadlock and wait on, and get what they wait for once the victim's code
releases its holds. The start time and call id of an edge are those of the
call, not of its incarnation, so a rewritten edge never changes the victim.
A deadlock that grows while it is being broken (a new reader joins a cycle
through a waiting writer) may lose two members, each the victim of what it saw.

What is left out: locks on different Redis deployments (a MultiLock across
servers, a RedLock), and a Redisson (Java) holder, which writes no edge: a
cycle through one is not found. An edge whose deletion failed (Redis
unreachable as the wait ended) stays until its life ends.
"""

from __future__ import annotations

import itertools
import math
import re
import secrets
import time
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from django_rlock.core._process.holder import holder_line, is_holder_field, read_holder
from django_rlock.core._protocol import clock, layouts
from django_rlock.core._protocol.calls import ScriptCall
from django_rlock.core._protocol.lock import LockEngine, MakeScript, ScriptSet
from django_rlock.core._protocol.names import LockKeys, milliseconds
from django_rlock.core._protocol.redisson import redisson_keys
from django_rlock.core.exceptions import DeadlockError

#: The most names a search reads: a deadlock spread wider is not looked for.
MAX_CYCLE = 64

#: The most wait edges a search reads.
MAX_OWNERS = 256


#: The shortest life of a wait edge, in seconds (see :func:`edge_life`).
MIN_EDGE_LIFE = 2.0


# KEYS[1] lock hash, KEYS[2] its fencing counter
# Returns {token or nil, {field, value, ...}}: the lock's grant and its hash,
# read at one instant (a search must never pair a holder with another grant's token).
# The plain lock keeps its token in its hash ('~t'); a sibling kind (and a
# plain lock an older version granted) in the counter.
READ_HOLD = """
local token = redis.call('hget', KEYS[1], '~t') or redis.call('get', KEYS[2])
return {token, redis.call('hgetall', KEYS[1])}
"""


# KEYS[1] the lock (Redisson's hash: its name), KEYS[2] RFencedLock's counter,
# KEYS[3] this library's description of a Python holder
# Returns {token or nil, {field, value, ...}, {field, value, ...}}: read at one instant.
READ_REDISSON = """
return {redis.call('get', KEYS[2]), redis.call('hgetall', KEYS[1]), redis.call('hgetall', KEYS[3])}
"""


# Defines `live_owners(index, prefix)`: {owner, {field, value, ...}, ...}, each
# member of the set `index` (sorted) whose hash `prefix .. owner` still exists,
# with that hash. The read-write lock's readers and the semaphore's holders
# are kept alike: an index of owners, one hash each.
_LIVE_OWNERS = """
local function live_owners(index, prefix)
    local live = {}
    local members = redis.call('smembers', index)
    table.sort(members)
    for _, owner in ipairs(members) do
        local fields = redis.call('hgetall', prefix .. owner)
        if #fields > 0 then
            table.insert(live, owner)
            table.insert(live, fields)
        end
    end
    return live
end
"""


# KEYS[1] write hash, KEYS[2] write fencing counter, KEYS[3] readers index
# ARGV[1] the read keys' common prefix
# Returns {token or nil, {field, value, ...} of the write hash,
#   {owner, {field, value, ...} of its read key, ...} of the live readers,
#   sorted}: read at one instant.
READ_RW = (
    _LIVE_OWNERS
    + """
local readers = live_owners(KEYS[3], ARGV[1])
local token = redis.call('hget', KEYS[1], '~t') or redis.call('get', KEYS[2])
return {token, redis.call('hgetall', KEYS[1]), readers}
"""
)


# KEYS[1] the semaphore's index
# ARGV[1] the permit hashes' common prefix
# Returns {owner, {field, value, ...} of its permit hash, ...}: every live
#   holder (sorted) with its permits and description, read at one instant.
READ_SEMAPHORE = (
    _LIVE_OWNERS
    + """
return live_owners(KEYS[1], ARGV[1])
"""
)


class DeadlockScripts(ScriptSet):
    """The detector's scripts: reads only (they may run when Redis is out of memory)."""

    def register(self, plain: MakeScript, oom_safe: MakeScript) -> None:
        """Make the scripts."""
        self.read_hold = plain(READ_HOLD)
        self.read_redisson = plain(READ_REDISSON)
        self.read_rw = plain(READ_RW)
        self.read_semaphore = plain(READ_SEMAPHORE)


# -- what a waiter waits for ---------------------------------------------------------

#: A lock or a fair lock (``key``: its hash).
LOCK = "lock"
#: The read side of a read-write lock (``key``: its base, ``<lock hash>:rw``).
READ = "read"
#: The write side of a read-write lock (``key``: its base).
WRITE = "write"
#: A permit of a semaphore (``key``: its index; the edge says ``sem<permits>``).
SEMAPHORE = "sem"
#: A lock in Redisson's layout (``key``: its name, which is its hash).
REDISSON = "redisson"

_WHAT = re.compile(r"(lock|read|write|redisson|sem[1-9][0-9]*)\Z")


@dataclass(frozen=True, slots=True)
class Wait:
    """What a waiter waits for: a kind of hold on one name's keys."""

    mode: str
    key: str
    #: A semaphore's permits, as the waiter counts them (0 for the other kinds).
    permits: int = 0

    @property
    def what(self) -> str:
        """The edge's word for it (``lock``, ``read``, ``write``, ``sem3``, ``redisson``)."""
        return f"{SEMAPHORE}{self.permits}" if self.mode == SEMAPHORE else self.mode

    @classmethod
    def parse(cls, what: str, key: str) -> Wait | None:
        """The wait an edge's word and key describe; None when the word is not one."""
        if not _WHAT.match(what):
            return None
        if what.startswith(SEMAPHORE):
            return cls(SEMAPHORE, key, int(what[len(SEMAPHORE) :]))
        return cls(what, key)

    @property
    def resource(self) -> tuple[str, str]:
        """What one read covers: both sides of a read-write lock are read together."""
        return ("rw" if self.mode in (READ, WRITE) else self.mode, self.key)


def read_hold_call(lock: str) -> ScriptCall:
    """The READ_HOLD call of the lock whose hash key is ``lock``."""
    return ScriptCall(keys=[lock, LockKeys.around("", lock).fence], args=[])


def read_call(prefix: str, wait: Wait) -> tuple[str, ScriptCall]:
    """The script (its name in :class:`DeadlockScripts`) and call that read what ``wait`` names."""
    if wait.mode == LOCK:
        return "read_hold", read_hold_call(wait.key)
    if wait.mode == REDISSON:
        keys = redisson_keys(prefix, wait.key)
        return "read_redisson", ScriptCall(keys=[keys.hash, keys.token, keys.holder], args=[])
    if wait.mode == SEMAPHORE:
        return "read_semaphore", ScriptCall(keys=[wait.key], args=[f"{wait.key}:permit:"])
    base = wait.key
    return "read_rw", ScriptCall(
        keys=[f"{base}:write", f"{base}:fence", f"{base}:readers"], args=[f"{base}:reader:"]
    )


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
    """A wait edge as stored: which acquire call waits, since when, for what."""

    started_ms: int
    call_id: str
    incarnation: int
    wait: Wait

    @property
    def lock(self) -> str:
        """The key of what it waits for."""
        return self.wait.key

    def encode(self) -> str:
        """The stored value (the key last: it may hold spaces)."""
        return (
            f"{self.started_ms} {self.call_id} {self.incarnation} {self.wait.what} {self.wait.key}"
        )

    @classmethod
    def decode(cls, raw: object) -> Edge | None:
        """The edge a stored value holds; None when it is missing or not an edge."""
        if isinstance(raw, bytes):
            raw = raw.decode("utf-8", "replace")
        if not isinstance(raw, str):
            return None
        parts = raw.split(" ", 4)
        if len(parts) != 5 or not parts[0].isdigit() or not parts[2].isdigit():
            return None
        wait = Wait.parse(parts[3], parts[4])
        if wait is None:
            return None
        return cls(int(parts[0]), parts[1], int(parts[2]), wait)

    @property
    def rank(self) -> tuple[int, str]:
        """The victim rule's order: the call that began last ranks highest."""
        return (self.started_ms, self.call_id)


@dataclass(frozen=True, slots=True)
class Link:
    """One step of a deadlock: what a member waits for, and the member holding it."""

    lock: str
    holder: dict[str, Any] | None
    #: What the member waits for (its kind and name; the lock kind for old callers).
    wait: Wait | None = None


@dataclass(frozen=True, slots=True)
class Cycle:
    """A deadlock a search found: a cycle from the caller, the members' edges, the readings."""

    links: tuple[Link, ...]
    #: The edges of the other members (the caller's own is the detector's).
    edges: tuple[Edge, ...]
    #: Every reply the search read, in order: the second search must read the same.
    readings: tuple[Any, ...] = field(repr=False)


#: A read the search asks the shell for: ``("edge", key)`` -> the GET reply;
#: ``(script, call)`` -> the reply of that script of :class:`DeadlockScripts`.
#: A check (:meth:`Detector.check`) also asks ``("renew", key, life_ms)`` ->
#: the PEXPIRE reply, and ``("write", key, value, life_ms)`` -> the SET reply.
Read = tuple[Any, ...]


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _fields(flat: Sequence[Any]) -> dict[str, str]:
    return {_text(flat[i]): _text(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}


def _count(value: str) -> int:
    return int(value) if value.lstrip("-").isdigit() else 0


@dataclass(slots=True)
class Holds:
    """What one read found held on one name: by whom, how much, and who they are."""

    #: Owner -> holds (a lock's or writer's holds, read holds, permits).
    holders: dict[str, int] = field(default_factory=dict)
    #: The read-write lock's writer (None: nobody writes, or not a read-write lock).
    writer: str | None = None
    #: Owner -> its description (None when it has none).
    info: dict[str, dict[str, Any] | None] = field(default_factory=dict)

    def blockers(self, wait: Wait, owner: str) -> list[str] | None:
        """Who ``owner``, waiting for ``wait``, waits on; None when it is not blocked."""
        if wait.mode in (LOCK, REDISSON):
            # One holder, or none; a holder that is the waiter itself was handed
            # the lock (a fair lock's handoff) and is about to take it.
            blocking = [holder for holder in self.holders if holder != owner]
            return blocking if len(self.holders) == 1 and blocking else None
        if wait.mode == SEMAPHORE:
            if sum(self.holders.values()) < wait.permits:
                return None  # a permit is free
            return sorted(self.holders)
        if self.writer is not None:
            return [self.writer] if self.writer != owner else None
        if wait.mode == WRITE:
            readers = sorted(reader for reader in self.holders if reader != owner)
            return readers or None
        return None  # a reader waits for a writer only

    def stuck(self, wait: Wait, owner: str, stuck: set[str]) -> bool:
        """Whether ``owner`` can never get ``wait`` while the ``stuck`` owners never move."""
        blocking = self.blockers(wait, owner)
        if blocking is None:
            return False
        if wait.mode == SEMAPHORE:
            held = sum(count for holder, count in self.holders.items() if holder in stuck)
            return held >= wait.permits
        return any(holder in stuck for holder in blocking)


def _holds(wait: Wait, reply: Any) -> Holds:
    """What the reply of :func:`read_call`'s script says is held."""
    found = Holds()
    parts = list(reply) if isinstance(reply, list | tuple) else []
    if wait.mode == SEMAPHORE:
        for i in range(0, len(parts) - 1, 2):
            owner, fields = _text(parts[i]), _fields(parts[i + 1] or [])
            found.holders[owner] = _count(fields.get(owner, "0"))
            found.info[owner] = read_holder(fields)
        return found
    token = parts[0] if parts else None
    fields = _fields(parts[1] or []) if len(parts) > 1 else {}
    owners = [name for name in fields if not is_holder_field(name)]
    if wait.mode == LOCK and token is None:
        return found  # free, or not a grant this library made
    if wait.mode in (LOCK, REDISSON):
        described = _fields(parts[2] or []) if len(parts) > 2 else fields
        for owner in owners:
            found.holders[owner] = _count(fields[owner])
            found.info[owner] = read_holder(described)
        return found
    # A read-write lock: its writer, else its readers.
    if len(owners) == 1:
        found.writer = owners[0]
        found.holders[owners[0]] = _count(fields[owners[0]])
        found.info[owners[0]] = read_holder(fields)
        return found
    readers = parts[2] if len(parts) > 2 and isinstance(parts[2], list | tuple) else []
    for i in range(0, len(readers) - 1, 2):
        owner, read = _text(readers[i]), _fields(readers[i + 1] or [])
        found.holders[owner] = _count(read.get(owner, "0"))
        found.info[owner] = read_holder(read)  # None for a read granted before it was kept
    return found


def walk(prefix: str, owner: str, wait: Wait | str) -> Generator[Read, Any, Cycle | None]:
    """Search the wait-for graph from ``owner``, waiting for ``wait`` (a lock hash key: a lock).

    Yields the reads (see :data:`Read`) and returns the deadlock the caller
    is part of (see the module's docstring), or None.
    """
    if isinstance(wait, str):
        wait = Wait(LOCK, wait)
    readings: list[Any] = []
    waits: dict[str, Wait] = {owner: wait}
    edges: dict[str, Edge] = {}
    read: dict[tuple[str, str], Holds] = {}
    running: set[str] = set()
    order = [owner]
    for member in order:  # grows as the search goes: breadth first
        waiting = waits[member]
        holds = read.get(waiting.resource)
        if holds is None:
            if len(read) >= MAX_CYCLE:
                continue  # not read: the member counts as one that may go on
            script, call = read_call(prefix, waiting)
            reply = yield (script, call)
            readings.append(reply)
            holds = read[waiting.resource] = _holds(waiting, reply)
        for holder in holds.blockers(waiting, member) or ():
            if holder in waits or holder in running or len(edges) >= MAX_OWNERS:
                continue
            raw = yield ("edge", edge_key(prefix, holder))
            readings.append(raw)
            edge = Edge.decode(raw)
            if edge is None:
                running.add(holder)  # it does not wait (for long): it will release
                continue
            edges[holder] = edge
            waits[holder] = edge.wait
            order.append(holder)
    members = _deadlock(owner, waits, read)
    if members is None:
        return None
    links = _cycle(owner, members, waits, read)
    others = tuple(edges[member] for member in sorted(members) if member != owner)
    return Cycle(links, others, tuple(readings))


def _reduce(candidates: set[str], waits: Mapping[str, Wait], read: Mapping[Any, Holds]) -> set[str]:
    """The owners of ``candidates`` that stay stuck when every other owner may go on."""
    stuck = set(candidates)
    changed = True
    while changed:
        changed = False
        for member in sorted(stuck):
            wait = waits[member]
            if not read[wait.resource].stuck(wait, member, stuck):
                stuck.discard(member)
                changed = True
    return stuck


def _successors(
    member: str, stuck: set[str], waits: Mapping[str, Wait], read: Mapping[Any, Holds]
) -> list[str]:
    wait = waits[member]
    return [
        holder for holder in read[wait.resource].blockers(wait, member) or () if holder in stuck
    ]


def _reach(start: str, step: Mapping[str, list[str]]) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for following in step.get(todo.pop(), ()):
            if following not in seen:
                seen.add(following)
                todo.append(following)
    return seen


def _deadlock(owner: str, waits: Mapping[str, Wait], read: Mapping[Any, Holds]) -> set[str] | None:
    """The members of the deadlock ``owner`` is part of (see the module's docstring), or None."""
    stuck = _reduce({member for member in waits if waits[member].resource in read}, waits, read)
    if owner not in stuck:
        return None
    forward = {member: _successors(member, stuck, waits, read) for member in stuck}
    backward: dict[str, list[str]] = {member: [] for member in stuck}
    for member, followers in forward.items():
        for following in followers:
            backward[following].append(member)
    component = _reach(owner, forward) & _reach(owner, backward)
    if component == {owner} and owner not in forward[owner]:
        return None  # it waits behind a deadlock, not in one: that one's victim breaks it
    alone = _reduce(component, waits, read)
    return alone if owner in alone else None


def _cycle(
    owner: str, members: set[str], waits: Mapping[str, Wait], read: Mapping[Any, Holds]
) -> tuple[Link, ...]:
    """A shortest cycle of ``members`` from ``owner`` back to it, one link per wait."""
    came_from: dict[str, str] = {}
    frontier = [owner]
    while frontier and owner not in came_from:
        following_frontier = []
        for member in frontier:
            for holder in _successors(member, members, waits, read):
                if holder not in came_from:
                    came_from[holder] = member
                    following_frontier.append(holder)
        frontier = following_frontier
    path = [owner]
    while True:
        previous = came_from[path[-1]]
        if previous == owner:
            break
        path.append(previous)
    path.append(owner)
    path.reverse()  # owner, the holder of what it waits for, ..., owner
    links = []
    for member, holder in itertools.pairwise(path):
        wait = waits[member]
        links.append(Link(wait.key, read[wait.resource].info.get(holder), wait))
    return tuple(links)


class Detector:
    """One acquire call's side of detection: its edge, and what a confirmed deadlock means.

    Made on the call's first check, so a call that never waits that long
    costs nothing.
    """

    def __init__(
        self,
        prefix: str,
        owner: str,
        wait: Wait | str,
        deadlock_timeout: float,
        started: float,
    ) -> None:
        if isinstance(wait, str):
            wait = Wait(LOCK, wait)
        self.prefix, self.owner, self.wait = prefix, owner, wait
        self.lock = wait.key
        self.key = edge_key(prefix, owner)
        self.life_ms = milliseconds(edge_life(deadlock_timeout))
        # The call's start (``started``, monotonic) on the wall clock: compared
        # across processes only as stored, so a skewed clock may pick another
        # victim, never two.
        began = time.time() - (clock.monotonic() - started)
        self._edge = Edge(int(began * 1000), secrets.token_hex(8), 0, wait)
        #: Whether the edge may have been written (then it is deleted as the call ends).
        self.written = False

    def edge_value(self) -> str:
        """The value to write: the first incarnation, or a new one once one was written."""
        if self.written:
            edge = self._edge
            self._edge = Edge(edge.started_ms, edge.call_id, edge.incarnation + 1, edge.wait)
        return self._edge.encode()

    def walk(self) -> Generator[Read, Any, Cycle | None]:
        """The search from this call (see :func:`walk`)."""
        return walk(self.prefix, self.owner, self.wait)

    def is_victim(self, cycle: Cycle) -> bool:
        """Whether this call is the one of ``cycle`` that must give up."""
        own = self._edge.rank
        return all(edge.rank < own for edge in cycle.edges)

    def check(self) -> Generator[Read, Any, Cycle | None]:
        """One deadlock check: write or renew the edge, then search the graph.

        Yields the reads (see :data:`Read`), as :func:`walk` does, and returns
        the cycle this call must give up for (the caller raises
        :func:`deadlock_error`), or None. A cycle counts only when a second
        search reads it again, and only the victim (:meth:`is_victim`) gives up.
        Both engines drive it (``_check_deadlock``), so they decide alike.
        """
        if not self.written or not (yield ("renew", self.key, self.life_ms)):
            value = self.edge_value()
            self.written = True  # before the call: a lost reply may have written it
            yield ("write", self.key, value, self.life_ms)
        cycle = yield from self.walk()
        if cycle is None:
            return None
        again = yield from self.walk()
        if again is not None and again.readings == cycle.readings and self.is_victim(cycle):
            return cycle
        return None


class DeadlockWaiter:
    """A lock's side of detection, in both engines' locks (a base of ``RLock`` and ``AsyncRLock``).

    Kept here rather than on :class:`~.lockbase.LockBase`: this module reads
    Redisson's keys, whose module stands on ``LockBase``. A sibling kind's
    ``_protocol`` base, before the engine's lock in the MRO, says what its
    waiters wait for (:meth:`_deadlock_wait`).
    """

    layout: ClassVar[str]
    keys: LockKeys
    _engine: LockEngine
    _deadlock_timeout: float | None

    def _detector(self, owner: str, started: float) -> Detector:
        """The deadlock detector of ``owner``'s acquire call begun at ``started`` (monotonic)."""
        every = self._deadlock_timeout
        if every is None:
            raise RuntimeError(f"{self!r} does not look for deadlocks")
        return Detector(self._engine.key_prefix, owner, self._deadlock_wait(), every, started)

    def _deadlock_wait(self) -> Wait:
        """What a waiter of this lock waits for, as its wait edge says (each kind its own).

        A plain lock's hash; in Redisson's layout that hash is the name, and a
        Java holder writes no edge (a search stops there).
        """
        return Wait(REDISSON if self.layout == layouts.REDISSON else LOCK, self.keys.hash)


def describe_holder(holder: Mapping[str, Any] | None) -> str:
    """A holder as a message shows it (:func:`~django_rlock.core._process.holder.holder_line`)."""
    return holder_line(holder)


def wait_kind(wait: Wait | None, key: str) -> str:
    """The kind of lock ``wait`` is for, as :attr:`DeadlockError.cycle` names it.

    ``lock``, ``fair_lock``, ``read_write_lock`` or ``semaphore``.
    """
    if wait is None or wait.mode in (LOCK, REDISSON):
        return "fair_lock" if key.endswith("}:fair") else "lock"
    return "semaphore" if wait.mode == SEMAPHORE else "read_write_lock"


def wait_name(prefix: str, wait: Wait | None, key: str) -> str:
    """The name the caller gave what ``key`` (waited for as ``wait``) belongs to."""
    if wait is not None and wait.mode == REDISSON:
        return key
    if (wait is not None and wait.mode != LOCK) or key.endswith("}:fair"):
        # A kind's keys hang off its name's lock hash: ``<lock hash>:fair``, ``:rw``, ``:sem``.
        closing = key.rfind("}")
        key = key[: closing + 1] if closing != -1 else key
    return LockKeys.name_of(prefix, key) or key


def _step(prefix: str, link: Link) -> str:
    name = wait_name(prefix, link.wait, link.lock)
    held_by = f"held by {describe_holder(link.holder)}"
    wait = link.wait
    if wait is None or wait.mode in (LOCK, REDISSON):
        kind = "fair lock" if wait_kind(wait, link.lock) == "fair_lock" else "lock"
        return f"{kind} {name!r} {held_by}"
    if wait.mode == SEMAPHORE:
        return f"a permit of semaphore {name!r} (permits={wait.permits}) {held_by}"
    side = "the write lock" if wait.mode == WRITE else "a read lock"
    holder = describe_holder(link.holder) if link.holder else "an owner"
    return f"{side} of {name!r} kept from it by {holder}"


def deadlock_message(prefix: str, cycle: Cycle, waited: float) -> str:
    """The victim's :class:`DeadlockError` message: every lock of the cycle and its holder."""
    first = cycle.links[0]
    steps = [_step(prefix, link) for link in cycle.links]
    what = wait_name(prefix, first.wait, first.lock)
    return (
        f"deadlock detected after waiting {waited:.3f}s for {what!r}: this caller waits "
        f"for {', which waits for '.join(steps)} (this caller). This acquire gave up to break "
        "the cycle (its call began last); release the locks it holds and retry, or take "
        "locks in one global order"
    )


def cycle_entries(prefix: str, cycle: Cycle) -> tuple[dict[str, Any], ...]:
    """:attr:`DeadlockError.cycle`: each step's lock name, kind and holder."""
    return tuple(
        {
            "lock": wait_name(prefix, link.wait, link.lock),
            "kind": wait_kind(link.wait, link.lock),
            "holder": link.holder,
        }
        for link in cycle.links
    )


def deadlock_error(prefix: str, name: str, cycle: Cycle, started: float) -> DeadlockError:
    """The victim's error for ``cycle``, found by its call on lock ``name`` begun at ``started``."""
    return DeadlockError(
        deadlock_message(prefix, cycle, clock.monotonic() - started),
        name=name,
        cycle=cycle_entries(prefix, cycle),
    )
