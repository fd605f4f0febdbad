"""Who waits for whom around one lock, for operators (``manage.py rlock inspect``).

Read from what deadlock detection writes (:mod:`django_rlock.core._protocol.deadlocks`):
a caller that has waited ``deadlock_timeout`` for a plain lock keeps a wait
edge, ``<prefix>:waits:<owner>``, naming the lock it waits for and since when.
Around the lock ``NAME`` that gives:

* **waited by**: the owners whose edge names ``NAME`` (found with SCAN over
  the edge keys, never KEYS): who has waited for it longer than the deadlock
  check;
* **its holder waits for**: the path out of ``NAME``'s holder, edge by edge:
  the lock it waits for, that lock's holder, the lock that one waits for...
  until a lock is free, a holder does not wait, or the path comes back to a
  lock it has passed. Back to ``NAME`` itself, it is a deadlock in the making
  (detection breaks it within ``deadlock_timeout``; with detection off, it
  waits for ever).

A snapshot, read key by key: not the exact two-walk check detection makes, so
it may show an edge that has just ended. Owners are shown as digests
(:func:`~django_rlock.backends._types.display_owner`): an owner id is a credential.
Waits shorter than ``deadlock_timeout``, waits of the other kinds (fair,
read-write, semaphore), the Redisson layout's and those of a client with
detection off write no edge: they are counted in ``waiters`` only.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from django_rlock.backends._types import display_owner
from django_rlock.core import LockClient
from django_rlock.core._faces import (
    MAX_CYCLE,
    REDISSON,
    Edge,
    LockKeys,
    check_name,
    edge_key,
    is_holder_field,
    read_holder,
    reported_unavailable,
    wait_name,
)

#: How many keys each SCAN step asks for (as ``rlock list`` does).
_SCAN_BATCH = 1000


@dataclass(frozen=True)
class Waiter:
    """An owner waiting for the lock: its digest, and for how long (by this machine's clock)."""

    owner: str
    waiting: float

    def as_json(self) -> dict[str, Any]:
        """The ``--json`` form."""
        return {"owner": self.owner, "waiting": round(self.waiting, 3)}


@dataclass(frozen=True)
class Step:
    """One step of the path out of the holder: it waits for ``lock``, held by ``holder``."""

    #: The lock waited for (its name).
    lock: str
    #: How long the previous holder has waited for it.
    waiting: float
    #: Its holder's digest, and description (None: free, or not a plain lock's single holder).
    owner: str | None
    holder: dict[str, Any] | None

    def as_json(self) -> dict[str, Any]:
        """The ``--json`` form."""
        return {
            "lock": self.lock,
            "waiting": round(self.waiting, 3),
            "owner": self.owner,
            "holder": self.holder,
        }


@dataclass(frozen=True)
class Waits:
    """Who waits for the lock, and what its holder waits for."""

    waited_by: tuple[Waiter, ...] = ()
    holder_waits_for: tuple[Step, ...] = ()
    #: Whether the path out of the holder came back to the lock: a deadlock.
    cycle: bool = False

    def as_json(self) -> dict[str, Any]:
        """The ``--json`` form: ``waited_by``, ``holder_waits_for``, ``deadlock``."""
        return {
            "waited_by": [waiter.as_json() for waiter in self.waited_by],
            "holder_waits_for": [step.as_json() for step in self.holder_waits_for],
            "deadlock": self.cycle,
        }


def _text(value: object) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)


def _glob_escape(text: str) -> str:
    return "".join(f"\\{char}" if char in "*?[]\\" else char for char in text)


def _waiting(edge: Edge, now_ms: float) -> float:
    return max(0.0, (now_ms - edge.started_ms) / 1000)


def read_waits(client: LockClient, name: str) -> Waits:
    """Who waits for the lock ``name`` of ``client``, and what its holder waits for.

    Raises LockUnavailableError when the server cannot be reached.
    """
    if client.layout == REDISSON:
        return Waits()  # Redisson's waits write no edge
    prefix = client.key_prefix
    lock = LockKeys.build(prefix, check_name(name)).hash
    with reported_unavailable(client.server, "inspect", name):
        waited_by = tuple(_waited_by(client, lock))
        path, cycle = _holder_path(client, lock)
    return Waits(waited_by=waited_by, holder_waits_for=path, cycle=cycle)


def _edges(client: LockClient) -> Iterator[tuple[str, Edge]]:
    """Every wait edge under the client's prefix: (the owner id, its edge)."""
    head = edge_key(client.key_prefix, "")
    match = f"{_glob_escape(head)}*"
    redis = client.redis
    batch: list[str] = []

    def read(keys: list[str]) -> Iterator[tuple[str, Edge]]:
        pipe = redis.pipeline(transaction=False)
        for key in keys:
            pipe.get(key)
        for key, raw in zip(keys, pipe.execute(), strict=True):
            edge = Edge.decode(raw)
            if edge is not None:  # ended since the scan
                yield key[len(head) :], edge

    seen: set[str] = set()
    for raw_key in redis.scan_iter(match=match, count=_SCAN_BATCH, _type="string"):
        key = _text(raw_key)
        if key in seen:
            continue  # SCAN may return a key twice
        seen.add(key)
        batch.append(key)
        if len(batch) >= _SCAN_BATCH:
            yield from read(batch)
            batch = []
    if batch:
        yield from read(batch)


def _waited_by(client: LockClient, lock: str) -> Iterator[Waiter]:
    now_ms = time.time() * 1000
    found = [
        Waiter(display_owner(owner), _waiting(edge, now_ms))
        for owner, edge in _edges(client)
        if edge.lock == lock
    ]
    yield from sorted(found, key=lambda waiter: -waiter.waiting)


def _holder_of(client: LockClient, lock: str) -> tuple[str | None, dict[str, Any] | None]:
    """The single owner id holding the plain lock hash ``lock`` and its description."""
    flat: Mapping[Any, Any] = client.redis.hgetall(lock)
    fields = {_text(key): _text(value) for key, value in flat.items()}
    owners = [owner for owner in fields if not is_holder_field(owner)]
    if len(owners) != 1:
        return None, None
    return owners[0], read_holder(fields)


def _holder_path(client: LockClient, start: str) -> tuple[tuple[Step, ...], bool]:
    """The path out of ``start``'s holder (see the module), and whether it comes back."""
    prefix = client.key_prefix
    steps: list[Step] = []
    passed = {start}
    owner, _ = _holder_of(client, start)
    for _ in range(MAX_CYCLE):
        if owner is None:
            break
        edge = Edge.decode(client.redis.get(edge_key(prefix, owner)))
        if edge is None:
            break  # the holder does not wait (for long)
        waiting = _waiting(edge, time.time() * 1000)
        owner, holder = _holder_of(client, edge.lock)
        name = wait_name(prefix, edge.wait, edge.lock)  # any kind's, by its name
        shown = None if owner is None else display_owner(owner)
        steps.append(Step(name, waiting, shown, holder))
        if edge.lock in passed:
            return tuple(steps), edge.lock == start
        passed.add(edge.lock)
    return tuple(steps), False
