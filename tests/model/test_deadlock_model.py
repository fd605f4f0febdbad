"""A model run of deadlock detection over every kind, checked against a recorded history.

Threads on two clients (two "processes") run units of work: each takes two
random names of mixed kinds (a lock, a fair lock, a read-write lock's read or
write side, a one-permit semaphore), holds them a random while, and gives
them back. The run records, under one mutex, who holds what in which mode and
who waits for what.

* **One global order** (names taken sorted): no cycle can form, so the
  detector, which checks almost every wait (``deadlock_timeout`` is short),
  must never raise: 0 false positives.
* **Random orders**: deadlocks form. Every :class:`DeadlockError` must match a
  cycle of the recorded state at the moment it was raised (the other members
  cannot move until the victim releases, so the record then *is* the
  deadlock): the victim waits for a name held, in a conflicting mode, by a
  thread that waits ... back to the victim. The checker is written here from
  the kinds' rules, independently of the detector's search. Every victim
  retries its unit, and every unit ends (each deadlock was broken).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from django_rlock.core import DeadlockError, LockClient
from tests.threads import run_to_end

pytestmark = [pytest.mark.slow]

#: Short, so that most waits check: the run is about exactness, not speed.
DEADLOCK_TIMEOUT = 0.05

#: The names and their kinds (a read-write lock is taken by either side).
NAMES = {"n0": "lock", "n1": "fair", "n2": "rw", "n3": "semaphore", "n4": "rw", "n5": "lock"}

#: How long any one test thread may run before the test calls it hung.
HANG = 120.0


@dataclass
class History:
    """Who holds what (and how), who waits for what; and every deadlock raised, with its check."""

    mutex: threading.Lock = field(default_factory=threading.Lock)
    holding: dict[str, dict[str, str]] = field(default_factory=dict)
    waiting: dict[str, tuple[str, str]] = field(default_factory=dict)
    deadlocks: list[tuple[str, bool]] = field(default_factory=list)
    units: int = 0
    errors: list[BaseException] = field(default_factory=list)

    def conflicts(self, name: str, wanted: str, held: str) -> bool:
        """Whether a hold of ``name`` in mode ``held`` keeps ``wanted`` from another thread."""
        return not (NAMES[name] == "rw" and wanted == held == "read")

    def blockers(self, thread: str) -> list[str]:
        name, mode = self.waiting[thread]
        return [
            other
            for other, holds in self.holding.items()
            if other != thread and name in holds and self.conflicts(name, mode, holds[name])
        ]

    def in_a_cycle(self, victim: str) -> bool:
        """Whether the recorded state has ``victim`` on a cycle of waits (every kind here is
        exclusive but a read beside a read, so a cycle is a deadlock)."""
        seen: set[str] = set()
        todo = [victim]
        while todo:
            thread = todo.pop()
            if thread not in self.waiting:
                continue
            for blocker in self.blockers(thread):
                if blocker == victim:
                    return True
                if blocker not in seen:
                    seen.add(blocker)
                    todo.append(blocker)
        return False


def take(client: LockClient, name: str, mode: str) -> Any:
    kind = NAMES[name]
    if kind == "lock":
        return client.lock(name)
    if kind == "fair":
        return client.fair_lock(name)
    if kind == "semaphore":
        return client.semaphore(name, 1)
    side = client.read_write_lock(name)
    return side.read if mode == "read" else side.write


def worker(history: History, client: LockClient, seed: int, units: int, *, ordered: bool) -> None:
    me = threading.current_thread().name
    chooser = random.Random(seed)
    history.holding[me] = {}
    for _ in range(units):
        names = chooser.sample(sorted(NAMES), 2)
        if ordered:
            names.sort()
        modes = [chooser.choice(["read", "write"]) for _ in names]
        for _attempt in range(100):
            try:
                with ExitStack() as stack:
                    for name, mode in zip(names, modes, strict=True):
                        with history.mutex:
                            history.waiting[me] = (name, mode)
                        try:
                            stack.enter_context(take(client, name, mode))
                        except DeadlockError:
                            with history.mutex:
                                real = history.in_a_cycle(me)
                                history.deadlocks.append((me, real))
                                del history.waiting[me]
                            raise
                        with history.mutex:
                            del history.waiting[me]
                            history.holding[me][name] = mode

                        def forget(name: str = name) -> None:
                            with history.mutex:
                                del history.holding[me][name]

                        stack.callback(forget)  # runs before the release: never a ghost hold
                    time.sleep(chooser.uniform(0, 3 * DEADLOCK_TIMEOUT))
            except DeadlockError:
                time.sleep(chooser.uniform(0, DEADLOCK_TIMEOUT))
                continue
            with history.mutex:
                history.units += 1
            break


def run(redis_url: str, *, ordered: bool, seed: int, threads: int, units: int) -> History:
    history = History()
    with (
        LockClient(redis_url, key_prefix="model", deadlock_timeout=DEADLOCK_TIMEOUT) as one,
        LockClient(redis_url, key_prefix="model", deadlock_timeout=DEADLOCK_TIMEOUT) as two,
    ):

        def guarded(index: int) -> None:
            try:
                worker(history, (one, two)[index % 2], seed * 100 + index, units, ordered=ordered)
            except BaseException as error:  # noqa: BLE001 -- reported by the test
                history.errors.append(error)

        workers = [
            threading.Thread(target=guarded, args=(i,), name=f"w{i}", daemon=True)
            for i in range(threads)
        ]
        run_to_end(workers, HANG, "a worker hung")
    return history


class EdgeWrites:
    """Counts the wait edges written (each a wait that checked), by keyspace notification."""

    def __init__(self, r: redis.Redis) -> None:
        r.config_set("notify-keyspace-events", "K$")
        self.pubsub = r.pubsub(ignore_subscribe_messages=True)
        self.pubsub.psubscribe("__keyspace@*__:model:waits:*")
        self.count = 0

    def drain(self) -> int:
        # None also stands for a subscription's confirmation: stop after a quiet while.
        quiet = 0
        while quiet < 3:
            message = self.pubsub.get_message(timeout=0.2)
            if message is None:
                quiet += 1
                continue
            quiet = 0
            if message["data"] in (b"set", "set"):
                self.count += 1
        return self.count


@pytest.fixture
def edges(r: redis.Redis) -> Iterator[EdgeWrites]:
    counter = EdgeWrites(r)
    yield counter
    counter.pubsub.close()
    r.config_set("notify-keyspace-events", "")
    assert not list(r.scan_iter("model:waits:*")), "a wait edge outlived its wait"


@pytest.mark.parametrize("seed", [1, 2])
def test_one_global_order_never_raises(edges: EdgeWrites, redis_url: str, seed: int) -> None:
    history = run(redis_url, ordered=True, seed=seed, threads=8, units=10)
    assert history.errors == []
    assert history.deadlocks == []
    assert history.units == 8 * 10
    checked = edges.drain()
    assert checked >= 10  # the detector looked, many times
    print(f"seed {seed}: 0 deadlocks, {checked} waits checked")


@pytest.mark.parametrize("seed", [1, 2])
def test_random_orders_every_deadlock_is_a_recorded_cycle(
    edges: EdgeWrites, redis_url: str, seed: int
) -> None:
    # Each run's every deadlock must be a recorded cycle. A run must make some to
    # say anything: on a loaded machine the threads, run one after another, may
    # make none; that run is taken again (at most three), never the assertions.
    for _ in range(3):
        history = run(redis_url, ordered=False, seed=seed, threads=6, units=8)
        assert history.errors == []
        assert [victim for victim, real in history.deadlocks if not real] == []
        assert history.units == 6 * 8  # every victim retried; nothing stayed stuck
        if history.deadlocks:
            break
    assert len(history.deadlocks) >= 1, "three runs made no deadlock"
    print(f"seed {seed}: {len(history.deadlocks)} deadlocks, {edges.drain()} waits checked")


def test_the_checker_tells_a_cycle_from_a_wait_that_ends() -> None:
    history = History()
    history.holding = {"a": {"n0": "write"}, "b": {"n2": "read"}, "c": {"n2": "read"}}
    history.waiting = {"a": ("n2", "write"), "b": ("n0", "write")}
    assert history.in_a_cycle("a") and history.in_a_cycle("b")  # a -> b (a reader) -> a
    history.waiting = {"a": ("n2", "read"), "b": ("n0", "write")}
    assert not history.in_a_cycle("b")  # a read beside reads is granted: a is not stuck
    history.waiting = {"a": ("n2", "write")}
    assert not history.in_a_cycle("a")  # b and c run
    history.waiting = {"c": ("n5", "write")}
    assert not history.in_a_cycle("c")  # nobody holds n5
