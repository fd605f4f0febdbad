"""Deadlocks through every lock kind, found and broken on real Redis, and no false ones.

A cycle through a read-write lock (a writer waiting for readers, a reader for
a writer), a fair lock, a semaphore whose permits stuck owners hold, or locks
in Redisson's layout ends with exactly one :class:`DeadlockError` within
``deadlock_timeout`` + 1 s; the other members get what they wait for. Waits
that are not deadlocks (re-entry, a read inside a write, slow holders, a dead
holder, a semaphore a running holder will free, contention in one global
order) never raise it. MultiLock treats a member's DeadlockError through its
own members as a failed round.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from typing import Any

import pytest
import redis

from django_rlock.core import DeadlockError, LockClient
from django_rlock.core.aio import AsyncLockClient
from tests.children import python_module, read_answer
from tests.threads import run_to_end

#: The detection delay the tests use (seconds).
DEADLOCK_TIMEOUT = 0.5

#: "Within deadlock_timeout + 1 s": generous for a loaded machine, tight enough to
#: tell detection from a timeout or a watchdog expiry.
SOON = DEADLOCK_TIMEOUT + 1.0

#: How long any one test thread may run before the test calls it hung.
HANG = 30.0


@pytest.fixture
def client(r: redis.Redis, redis_url: str) -> Iterator[LockClient]:
    with LockClient(redis_url, key_prefix="test", deadlock_timeout=DEADLOCK_TIMEOUT) as made:
        yield made


def no_edges_left(r: redis.Redis) -> bool:
    """Every wait edge was deleted as its wait ended."""
    return not list(r.scan_iter("test:waits:*"))


Take = Callable[[], AbstractContextManager[Any]]


class Member(threading.Thread):
    """A thread that takes ``first``, waits at the barrier, then takes ``second``."""

    def __init__(self, first: Take, second: Take, barrier: threading.Barrier) -> None:
        super().__init__(daemon=True)
        self.first, self.second, self.barrier = first, second, barrier
        self.outcome: str | None = None
        self.error: DeadlockError | None = None
        self.seconds = 0.0

    def run(self) -> None:
        try:
            with self.first():
                self.barrier.wait(HANG)
                began = time.monotonic()
                try:
                    with self.second():
                        self.outcome = "granted"
                except DeadlockError as error:
                    self.outcome = "deadlock"
                    self.error = error
                self.seconds = time.monotonic() - began
        except BaseException as error:  # noqa: BLE001 -- reported by the test
            self.outcome = f"failed: {error!r}"


def run_cycle(pairs: list[tuple[Take, Take]]) -> Member:
    """Members taking each pair in turn; returns the one victim after checking the others."""
    barrier = threading.Barrier(len(pairs))
    members = [Member(first, second, barrier) for first, second in pairs]
    run_to_end(members, HANG, "a member of the cycle hung")
    outcomes = [member.outcome for member in members]
    assert sorted(outcomes, key=str) == sorted(
        ["deadlock"] + ["granted"] * (len(pairs) - 1), key=str
    ), outcomes
    victim = next(member for member in members if member.outcome == "deadlock")
    assert victim.seconds < SOON, victim.seconds
    assert isinstance(victim.error, DeadlockError)
    return victim


# -- cycles through each kind -----------------------------------------------------------


def test_a_writer_waiting_for_a_reader_that_waits_for_its_lock(
    client: LockClient, r: redis.Redis
) -> None:
    rw = client.read_write_lock("report")
    plain = client.lock("order:1")
    victim = run_cycle([(lambda: plain, lambda: rw.write), (lambda: rw.read, lambda: plain)])
    assert victim.error is not None
    kinds = sorted(entry["kind"] for entry in victim.error.cycle)
    assert kinds == ["lock", "read_write_lock"]
    reader = next(e for e in victim.error.cycle if e["kind"] == "read_write_lock")["holder"]
    assert reader is not None and reader["pid"] == os.getpid()  # a reader is described too
    assert {entry["lock"] for entry in victim.error.cycle} == {"report", "order:1"}
    assert no_edges_left(r)


def test_a_reader_waiting_for_a_writer_that_waits_for_its_lock(
    client: LockClient, r: redis.Redis
) -> None:
    rw = client.read_write_lock("report")
    plain = client.lock("order:1")
    victim = run_cycle([(lambda: rw.write, lambda: plain), (lambda: plain, lambda: rw.read)])
    assert victim.error is not None
    writer = next(e for e in victim.error.cycle if e["kind"] == "read_write_lock")
    assert writer["holder"] is not None  # a writer is described, as a lock's holder is
    assert no_edges_left(r)


def test_a_read_inside_a_write_and_a_cycle_beside_it(client: LockClient, r: redis.Redis) -> None:
    # The writer reads its own lock (re-entry inside write) before closing a
    # cycle with another thread: the read is granted at once, the cycle found.
    rw = client.read_write_lock("doc")
    plain = client.lock("index")

    def write_then_read() -> AbstractContextManager[Any]:
        rw.write.acquire()
        assert rw.read.acquire(blocking=False)
        rw.read.release()
        return _Releasing(rw.write)

    victim = run_cycle([(write_then_read, lambda: plain), (lambda: plain, lambda: rw.write)])
    assert victim.error is not None
    assert no_edges_left(r)


class _Releasing:
    """A context manager that releases a lock the caller already took."""

    def __init__(self, lock: Any) -> None:
        self.lock = lock

    def __enter__(self) -> Any:
        return self.lock

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def test_two_fair_locks_in_opposite_order(client: LockClient, r: redis.Redis) -> None:
    a, b = client.fair_lock("fair:a"), client.fair_lock("fair:b")
    victim = run_cycle([(lambda: a, lambda: b), (lambda: b, lambda: a)])
    assert victim.error is not None
    assert {entry["kind"] for entry in victim.error.cycle} == {"fair_lock"}
    assert "fair lock 'fair:" in str(victim.error)
    assert no_edges_left(r)
    assert not list(r.scan_iter("test:*fair:queue"))  # the victim left the queue


def test_a_fair_lock_and_a_plain_lock_with_a_queue_behind(
    client: LockClient, r: redis.Redis
) -> None:
    fair, plain = client.fair_lock("fair"), client.lock("plain")
    bystander_done = threading.Event()

    def bystander() -> None:
        time.sleep(0.2)  # queues behind the cycle's members: waits, never a victim
        with client.fair_lock("fair"):
            bystander_done.set()

    thread = threading.Thread(target=bystander, daemon=True)
    thread.start()
    run_cycle([(lambda: fair, lambda: plain), (lambda: plain, lambda: fair)])
    thread.join(HANG)
    assert bystander_done.is_set()
    assert no_edges_left(r)


def test_a_semaphore_of_one_permit_and_a_lock(client: LockClient, r: redis.Redis) -> None:
    semaphore = client.semaphore("pool", 1)
    plain = client.lock("row")
    victim = run_cycle([(lambda: semaphore, lambda: plain), (lambda: plain, lambda: semaphore)])
    assert victim.error is not None
    assert {entry["kind"] for entry in victim.error.cycle} == {"lock", "semaphore"}
    assert no_edges_left(r)


def test_a_semaphore_whose_every_permit_holder_waits_for_the_waiter(
    client: LockClient, r: redis.Redis
) -> None:
    # Two threads hold the two permits and wait for a lock held by a third,
    # which waits for a permit: a deadlock of three (no holder can go on).
    semaphore = client.semaphore("pool", 2)
    plain = client.lock("row")
    victim = run_cycle(
        [
            (lambda: semaphore, lambda: plain),
            (lambda: semaphore, lambda: plain),
            (lambda: plain, lambda: semaphore),
        ]
    )
    assert victim.error is not None
    assert no_edges_left(r)


def test_a_semaphore_taken_twice_by_one_thread_is_a_deadlock_of_one(
    client: LockClient, r: redis.Redis
) -> None:
    semaphore = client.semaphore("pool", 1)
    with semaphore:
        began = time.monotonic()
        with pytest.raises(DeadlockError) as raised:
            semaphore.acquire()
        assert time.monotonic() - began < SOON
    assert [entry["kind"] for entry in raised.value.cycle] == ["semaphore"]
    assert semaphore.available() == 1
    assert no_edges_left(r)


def test_locks_in_redissons_layout(r: redis.Redis, redis_url: str) -> None:
    with LockClient(
        redis_url, key_prefix="test", layout="redisson", deadlock_timeout=DEADLOCK_TIMEOUT
    ) as client:
        a, b = client.lock("redisson-a"), client.lock("redisson-b")
        victim = run_cycle([(lambda: a, lambda: b), (lambda: b, lambda: a)])
        assert victim.error is not None
        assert {entry["lock"] for entry in victim.error.cycle} == {"redisson-a", "redisson-b"}
        holders = [entry["holder"] for entry in victim.error.cycle]
        assert all(holder and holder["pid"] == os.getpid() for holder in holders)
    assert no_edges_left(r)


def test_asyncio_tasks_through_a_read_write_lock_and_a_semaphore(
    r: redis.Redis, redis_url: str
) -> None:
    async def main() -> list[str]:
        async with AsyncLockClient(
            redis_url, key_prefix="test", deadlock_timeout=DEADLOCK_TIMEOUT
        ) as client:
            rw = client.read_write_lock("doc")
            semaphore = client.semaphore("pool", 1)
            both = asyncio.Barrier(2)

            async def member(first: Any, second: Any) -> str:
                async with first:
                    await both.wait()
                    began = time.monotonic()
                    try:
                        async with second:
                            return "granted"
                    except DeadlockError:
                        assert time.monotonic() - began < SOON
                        return "deadlock"

            both_done = asyncio.gather(member(rw.read, semaphore), member(semaphore, rw.write))
            return list(await asyncio.wait_for(both_done, HANG))

    assert sorted(asyncio.run(main())) == ["deadlock", "granted"]
    assert no_edges_left(r)


def test_asyncio_tasks_through_two_fair_locks(r: redis.Redis, redis_url: str) -> None:
    async def main() -> list[str]:
        async with AsyncLockClient(
            redis_url, key_prefix="test", deadlock_timeout=DEADLOCK_TIMEOUT
        ) as client:
            a, b = client.fair_lock("afair:a"), client.fair_lock("afair:b")
            both = asyncio.Barrier(2)

            async def member(first: Any, second: Any) -> str:
                async with first:
                    await both.wait()
                    try:
                        async with second:
                            return "granted"
                    except DeadlockError as error:
                        return "deadlock " + ",".join(sorted({e["kind"] for e in error.cycle}))

            both_done = asyncio.gather(member(a, b), member(b, a))
            return list(await asyncio.wait_for(both_done, HANG))

    assert sorted(asyncio.run(main())) == ["deadlock fair_lock", "granted"]
    assert no_edges_left(r)
    assert not list(r.scan_iter("test:*fair:queue"))


def test_three_processes_through_a_read_write_lock_a_lock_and_a_semaphore(
    redis_url: str, r: redis.Redis
) -> None:
    # P1 reads rw and waits for p; P2 holds p and waits for a permit; P3 holds
    # the permit and waits to write rw, which P1 reads.
    members = [("read:rw", "p"), ("p", "sem1:s"), ("sem1:s", "write:rw")]
    timeout = str(DEADLOCK_TIMEOUT)
    with ExitStack() as stack:
        children = [
            stack.enter_context(
                python_module(
                    "tests.sync.deadlock_member", redis_url, first, second, timeout, stdin=True
                )
            )
            for first, second in members
        ]
        for child in children:
            assert read_answer(child) == {"held": True}
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        answers = [read_answer(child) for child in children]
    outcomes = [answer["outcome"] for answer in answers]
    assert sorted(outcomes) == ["deadlock", "granted", "granted"], answers
    victim = next(answer for answer in answers if answer["outcome"] == "deadlock")
    assert victim["seconds"] < SOON
    assert {entry["kind"] for entry in victim["cycle"]} == {"lock", "read_write_lock", "semaphore"}
    assert {entry["holder"]["pid"] for entry in victim["cycle"]} == {c.pid for c in children}
    assert no_edges_left(r)


# -- MultiLock ------------------------------------------------------------------------


def test_two_multilocks_in_opposite_order_both_finish(client: LockClient, r: redis.Redis) -> None:
    # A member's DeadlockError through the round's own members is a failed
    # round: released, paused, retried; both MultiLocks get all their locks.
    a, b = client.lock("ma"), client.lock("mb")
    outcomes: list[str] = []
    barrier = threading.Barrier(2)

    def take(*order: Any) -> None:
        lock = client.multi_lock(*order)
        try:
            for _ in range(3):
                barrier.wait(HANG)
                with lock:
                    time.sleep(0.05)
            outcomes.append("done")
        except BaseException as error:  # noqa: BLE001 -- reported by the test
            outcomes.append(f"failed: {error!r}")

    threads = [threading.Thread(target=take, args=order) for order in ((a, b), (b, a))]
    run_to_end(threads, HANG * 2)
    assert outcomes == ["done", "done"]
    assert no_edges_left(r)


def test_a_multilock_cycle_through_a_lock_held_outside_it_raises(
    client: LockClient, r: redis.Redis
) -> None:
    # Another round cannot break a cycle through a lock the caller holds
    # outside the MultiLock: its DeadlockError surfaces.
    outside, member = client.lock("outside"), client.lock("member")

    def with_multilock() -> AbstractContextManager[Any]:
        return client.multi_lock(member)

    victim = run_cycle([(lambda: outside, with_multilock), (lambda: member, lambda: outside)])
    assert victim.error is not None
    assert no_edges_left(r)


# -- no false positives -----------------------------------------------------------------


def test_readers_and_writers_under_contention_never_deadlock(
    client: LockClient, r: redis.Redis
) -> None:
    # Slow holders (longer than deadlock_timeout) of one read-write lock and
    # one plain lock, always taken in the same order: many checks, no cycle.
    rw, plain = client.read_write_lock("rw"), client.lock("after")
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        chooser = random.Random(index)
        try:
            for _ in range(3):
                side = rw.write if chooser.random() < 0.4 else rw.read
                with side:
                    if side is rw.write:
                        with rw.read:  # a read inside the write: re-entry, never a wait
                            pass
                    with plain:
                        time.sleep(DEADLOCK_TIMEOUT * chooser.uniform(0.1, 0.6))
        except BaseException as error:  # noqa: BLE001 -- reported by the test
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(5)]
    run_to_end(threads, HANG * 2)
    assert errors == []
    assert no_edges_left(r)


def test_semaphore_waiters_behind_slow_holders_never_deadlock(
    client: LockClient, r: redis.Redis
) -> None:
    # Holders that also wait (for a lock held by a slow thread that waits for
    # nothing) are not stuck: the semaphore's waiters wait, never raise.
    semaphore, plain = client.semaphore("pool", 2), client.lock("slow")
    errors: list[BaseException] = []
    holding = threading.Event()

    def slow() -> None:
        with plain:
            holding.set()
            time.sleep(DEADLOCK_TIMEOUT * 3)

    def holder() -> None:
        try:
            with semaphore, plain:
                pass
        except BaseException as error:  # noqa: BLE001 -- reported by the test
            errors.append(error)

    def waiter() -> None:
        try:
            with semaphore:
                pass
        except BaseException as error:  # noqa: BLE001 -- reported by the test
            errors.append(error)

    threads = [threading.Thread(target=slow, daemon=True)]
    threads[0].start()
    assert holding.wait(HANG)
    threads += [threading.Thread(target=holder, daemon=True) for _ in range(2)]
    threads += [threading.Thread(target=waiter, daemon=True) for _ in range(2)]
    for thread in threads[1:]:
        thread.start()
    for thread in threads:
        thread.join(HANG)
        assert not thread.is_alive()
    assert errors == []
    assert no_edges_left(r)


def test_a_dead_semaphore_holder_is_waited_out_not_reported(r: redis.Redis, redis_url: str) -> None:
    # A child holds the only permit and is killed: its permit expires with the
    # watchdog timeout; the waiter checks several times meanwhile, finds the
    # holder waits for nothing, and gets the permit.
    with (
        LockClient(
            redis_url, key_prefix="test", watchdog_timeout=2.0, deadlock_timeout=0.2
        ) as client,
        python_module("tests.sync.semaphore_holder", redis_url, "dead", "1", "1", "2.0") as child,
    ):
        assert read_answer(child) == {"held": 1}
        os.kill(child.pid, signal.SIGKILL)
        child.wait(HANG)
        assert client.semaphore("dead", 1).acquire(timeout=HANG)
        client.semaphore("dead", 1).release()
    assert no_edges_left(r)


def test_fair_locks_in_one_global_order_never_deadlock(client: LockClient, r: redis.Redis) -> None:
    names = [f"fair:{i}" for i in range(4)]
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        chooser = random.Random(index)
        try:
            for _ in range(6):
                first, second = sorted(chooser.sample(names, 2))
                with client.fair_lock(first), client.fair_lock(second):
                    time.sleep(chooser.uniform(0, 0.05))
        except BaseException as error:  # noqa: BLE001 -- reported by the test
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(6)]
    run_to_end(threads, HANG * 2)
    assert errors == []
    assert no_edges_left(r)


def test_a_long_chain_through_every_kind_to_a_slow_holder_never_deadlocks(
    client: LockClient, r: redis.Redis
) -> None:
    # end <- semaphore <- write lock <- fair lock <- waiter, each link held by
    # a thread that waits for the next; the last holder only sleeps. Every
    # waiter checks several times and finds a chain, never a cycle; re-entries
    # of each kind on the way are granted at once.
    semaphore = client.semaphore("chain:sem", 2)
    rw = client.read_write_lock("chain:rw")
    fair, end = client.fair_lock("chain:fair"), client.lock("chain:end")
    links: list[tuple[Any, Any]] = [(semaphore, end), (rw.write, semaphore), (fair, rw.read)]
    errors: list[BaseException] = []
    ready = threading.Barrier(len(links) + 2)

    def slow() -> None:
        with end:
            ready.wait(HANG)
            time.sleep(DEADLOCK_TIMEOUT * 4)

    def link(first: Any, second: Any) -> None:
        try:
            with first:
                with first:  # re-entry (a semaphore's second permit: one is free)
                    pass
                ready.wait(HANG)
                time.sleep(0.1)
                with second:
                    pass
        except BaseException as error:  # noqa: BLE001 -- reported by the test
            errors.append(error)

    def last() -> None:
        ready.wait(HANG)
        time.sleep(0.2)
        try:
            with fair:
                pass
        except BaseException as error:  # noqa: BLE001 -- reported by the test
            errors.append(error)

    threads = [threading.Thread(target=slow, daemon=True)]
    threads += [threading.Thread(target=link, args=pair, daemon=True) for pair in links]
    threads += [threading.Thread(target=last, daemon=True)]
    run_to_end(threads, HANG)
    assert errors == []
    assert no_edges_left(r)
