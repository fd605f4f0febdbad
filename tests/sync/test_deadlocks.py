"""Deadlocks found and broken on real Redis: threads, processes, asyncio tasks, and no false ones.

A cycle of waiters (each holds a lock the next waits for) ends with exactly
one :class:`DeadlockError`, soon after ``deadlock_timeout``; the other members
get their locks. Waits that are not deadlocks (a slow holder, a long chain,
re-entry, contention in one global order) never raise it.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from django_rlock.core import DeadlockError, LockClient, LockError, LockTimeout
from django_rlock.core.aio import AsyncLockClient
from tests.children import python_module, read_answer
from tests.threads import run_to_end

#: The detection delay the tests use (seconds).
DEADLOCK_TIMEOUT = 0.5

#: The bound on "soon" for a loaded machine: catches a hang, never a slow run.
SOON = 5.0

#: How long any one test thread may run before the test calls it hung.
HANG = 30.0


@pytest.fixture
def client(r: redis.Redis, redis_url: str) -> Iterator[LockClient]:
    with LockClient(redis_url, key_prefix="test", deadlock_timeout=DEADLOCK_TIMEOUT) as made:
        yield made


def no_edges_left(r: redis.Redis) -> bool:
    """Every wait edge was deleted as its wait ended."""
    return not list(r.scan_iter("test:waits:*"))


class Member(threading.Thread):
    """A thread that takes ``first``, waits at the barrier, then takes ``second``."""

    def __init__(
        self, client: LockClient, first: str, second: str, barrier: threading.Barrier
    ) -> None:
        super().__init__(daemon=True)
        self.client, self.first, self.second, self.barrier = client, first, second, barrier
        self.outcome: str | None = None
        self.error: BaseException | None = None
        self.seconds = 0.0

    def run(self) -> None:
        try:
            with self.client.lock(self.first):
                self.barrier.wait(HANG)
                began = time.monotonic()
                try:
                    with self.client.lock(self.second):
                        self.outcome = "granted"
                except DeadlockError as error:
                    self.outcome = "deadlock"
                    self.error = error
                self.seconds = time.monotonic() - began
        except BaseException as error:  # noqa: BLE001 -- reported by the test
            self.outcome = f"failed: {error!r}"


def run_ring(client: LockClient, names: list[str]) -> list[Member]:
    """Members in a ring: member i holds names[i] and waits for names[i + 1]."""
    barrier = threading.Barrier(len(names))
    members = [
        Member(client, names[i], names[(i + 1) % len(names)], barrier) for i in range(len(names))
    ]
    run_to_end(members, HANG, "a member of the cycle hung")
    return members


def assert_one_victim(outcomes: list[str | None]) -> None:
    assert sorted(outcomes, key=str) == sorted(
        ["deadlock"] + ["granted"] * (len(outcomes) - 1), key=str
    ), outcomes


# -- cycles ------------------------------------------------------------------------


def test_two_threads_in_opposite_order_one_gets_deadlock_error(
    client: LockClient, r: redis.Redis
) -> None:
    members = run_ring(client, ["order:1", "customer:7"])
    assert_one_victim([member.outcome for member in members])
    victim = next(member for member in members if member.outcome == "deadlock")
    assert victim.seconds < SOON
    error = victim.error
    assert isinstance(error, DeadlockError)
    assert isinstance(error, LockError)
    assert error.name == victim.second
    # The cycle from the victim's lock, every lock with its holder, back to the victim.
    assert [entry["lock"] for entry in error.cycle] == [victim.second, victim.first]
    survivor = next(member for member in members if member is not victim)
    assert error.cycle[0]["holder"]["thread"] == survivor.name
    assert error.cycle[1]["holder"]["thread"] == victim.name
    assert "deadlock detected" in str(error)
    assert "'order:1'" in str(error) and "'customer:7'" in str(error)
    assert no_edges_left(r)


def test_three_threads_in_a_ring(client: LockClient, r: redis.Redis) -> None:
    members = run_ring(client, ["a", "b", "c"])
    assert_one_victim([member.outcome for member in members])
    victim = next(member for member in members if member.outcome == "deadlock")
    assert victim.seconds < SOON
    assert isinstance(victim.error, DeadlockError)
    assert len(victim.error.cycle) == 3
    assert no_edges_left(r)


def test_two_processes_in_opposite_order(redis_url: str, r: redis.Redis) -> None:
    args = (redis_url, str(DEADLOCK_TIMEOUT))
    with (
        python_module("tests.sync.deadlock_member", redis_url, "x", "y", args[1], stdin=True) as a,
        python_module("tests.sync.deadlock_member", redis_url, "y", "x", args[1], stdin=True) as b,
    ):
        assert read_answer(a) == {"held": True}
        assert read_answer(b) == {"held": True}
        for child in (a, b):
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        answers = [read_answer(a), read_answer(b)]
    assert_one_victim([answer["outcome"] for answer in answers])
    victim = next(answer for answer in answers if answer["outcome"] == "deadlock")
    assert victim["seconds"] < SOON
    pids = {entry["holder"]["pid"] for entry in victim["cycle"]}
    assert pids == {a.pid, b.pid}
    assert no_edges_left(r)


def test_three_processes_in_a_ring(redis_url: str, r: redis.Redis) -> None:
    timeout = str(DEADLOCK_TIMEOUT)
    module = "tests.sync.deadlock_member"
    with (
        python_module(module, redis_url, "p1", "p2", timeout, stdin=True) as a,
        python_module(module, redis_url, "p2", "p3", timeout, stdin=True) as b,
        python_module(module, redis_url, "p3", "p1", timeout, stdin=True) as c,
    ):
        children = (a, b, c)
        for child in children:
            assert read_answer(child) == {"held": True}
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        answers = [read_answer(child) for child in children]
    assert_one_victim([answer["outcome"] for answer in answers])
    victim = next(answer for answer in answers if answer["outcome"] == "deadlock")
    assert victim["seconds"] < SOON
    assert {entry["holder"]["pid"] for entry in victim["cycle"]} == {a.pid, b.pid, c.pid}
    assert no_edges_left(r)


def test_two_asyncio_tasks_in_opposite_order(redis_url: str, r: redis.Redis) -> None:
    async def scenario() -> list[Any]:
        async with AsyncLockClient(
            redis_url, key_prefix="test", deadlock_timeout=DEADLOCK_TIMEOUT
        ) as client:
            both_hold = asyncio.Barrier(2)

            async def member(first: str, second: str) -> tuple[str, float, Any]:
                async with client.lock(first):
                    await both_hold.wait()
                    began = time.monotonic()
                    try:
                        async with client.lock(second):
                            return "granted", time.monotonic() - began, None
                    except DeadlockError as error:
                        return "deadlock", time.monotonic() - began, error

            return await asyncio.wait_for(asyncio.gather(member("p", "q"), member("q", "p")), HANG)

    results = asyncio.run(scenario())
    assert_one_victim([outcome for outcome, _, _ in results])
    _, seconds, error = next(result for result in results if result[0] == "deadlock")
    assert seconds < SOON
    assert [entry["lock"] for entry in error.cycle] in (["q", "p"], ["p", "q"])
    assert no_edges_left(r)


def test_a_thread_and_an_asyncio_task(client: LockClient, redis_url: str, r: redis.Redis) -> None:
    barrier = threading.Barrier(2)
    thread = Member(client, "left", "right", barrier)
    thread.start()

    async def task() -> str:
        async with (
            AsyncLockClient(
                redis_url, key_prefix="test", deadlock_timeout=DEADLOCK_TIMEOUT
            ) as aclient,
            aclient.lock("right"),
        ):
            await asyncio.to_thread(barrier.wait, HANG)
            try:
                async with aclient.lock("left"):
                    return "granted"
            except DeadlockError:
                return "deadlock"

    outcome = asyncio.run(asyncio.wait_for(task(), HANG))
    thread.join(HANG)
    assert not thread.is_alive()
    assert_one_victim([thread.outcome, outcome])
    assert no_edges_left(r)


def test_the_victim_is_the_call_that_began_last(client: LockClient, r: redis.Redis) -> None:
    """The member whose acquire began last gives up: here, always the later one.

    The order is made by events, not sleeps: the early one asks for "n" once the
    late one holds it, and the late one asks for "m" once the early one's wait
    shows on the server (its wait edge, written at its first check). With sleeps,
    a loaded machine started the late thread after the early one was done: no
    deadlock at all.
    """
    early_holds, late_holds = threading.Event(), threading.Event()
    outcomes: dict[str, str] = {}

    def early() -> None:
        with client.lock("m"):
            early_holds.set()
            late_holds.wait(HANG)
            try:
                with client.lock("n"):
                    outcomes["early"] = "granted"
            except DeadlockError:
                outcomes["early"] = "deadlock"

    def late() -> None:
        with client.lock("n"):
            late_holds.set()
            early_holds.wait(HANG)
            deadline = time.monotonic() + HANG
            while not list(r.scan_iter("test:waits:*")):  # the early one waits for "n"
                assert time.monotonic() < deadline, "the early one never waited"
                time.sleep(0.01)
            try:
                with client.lock("m"):
                    outcomes["late"] = "granted"
            except DeadlockError:
                outcomes["late"] = "deadlock"

    threads = [threading.Thread(target=early), threading.Thread(target=late)]
    run_to_end(threads, HANG)
    assert outcomes == {"early": "granted", "late": "deadlock"}


# -- no false positives ------------------------------------------------------------


def test_reentry_never_deadlocks(client: LockClient) -> None:
    lock = client.lock("again")
    with lock, lock, lock:
        assert lock.hold_count() == 3


def test_a_slow_holder_is_waited_for(client: LockClient, r: redis.Redis) -> None:
    holding = threading.Event()

    def slow() -> None:
        with client.lock("slow"):
            holding.set()
            time.sleep(3 * DEADLOCK_TIMEOUT)

    holder = threading.Thread(target=slow)
    holder.start()
    assert holding.wait(HANG)
    began = time.monotonic()
    with client.lock("slow"):
        waited = time.monotonic() - began
    holder.join(HANG)
    assert waited > DEADLOCK_TIMEOUT  # it did wait long enough to check
    assert no_edges_left(r)


def test_a_long_acyclic_chain_never_deadlocks(client: LockClient, r: redis.Redis) -> None:
    """Member i holds link i and waits for link i + 1; the last one holds its link a while."""
    size = 5
    barrier = threading.Barrier(size)
    errors: list[BaseException] = []

    def member(i: int) -> None:
        try:
            with client.lock(f"link:{i}"):
                barrier.wait(HANG)
                if i == size - 1:
                    time.sleep(4 * DEADLOCK_TIMEOUT)  # every other member checks meanwhile
                    return
                with client.lock(f"link:{i + 1}"):
                    pass
        except BaseException as error:  # noqa: BLE001 -- reported by the test
            errors.append(error)

    threads = [threading.Thread(target=member, args=(i,)) for i in range(size)]
    run_to_end(threads, HANG)
    assert errors == []
    assert no_edges_left(r)


def test_heavy_contention_in_one_global_order_never_deadlocks(
    r: redis.Redis, redis_url: str
) -> None:
    """Random pairs of few locks, always taken in sorted order: waits, checks, no cycle."""
    # A short deadlock_timeout, so that many waits check (and walk chains of waiters).
    with LockClient(redis_url, key_prefix="test", deadlock_timeout=0.02) as client:
        names = [f"res:{i}" for i in range(4)]
        errors: list[BaseException] = []
        rounds = 25

        def worker(seed: int) -> None:
            rng = random.Random(seed)
            try:
                for _ in range(rounds):
                    pair = sorted(rng.sample(names, 2))
                    with client.lock(pair[0]), client.lock(pair[1]):
                        time.sleep(rng.uniform(0.005, 0.03))
            except BaseException as error:  # noqa: BLE001 -- reported by the test
                errors.append(error)

        threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
        run_to_end(threads, 120)
    assert errors == []
    assert no_edges_left(r)


def test_detection_off_never_raises(r: redis.Redis, redis_url: str) -> None:
    """``deadlock_timeout=None``: a cycle ends only by its members' own timeouts."""
    with LockClient(redis_url, key_prefix="test", deadlock_timeout=None) as client:
        barrier = threading.Barrier(2)
        outcomes: list[str] = []

        def member(first: str, second: str) -> None:
            with client.lock(first):
                barrier.wait(HANG)
                try:
                    with client.lock(second, timeout=4 * DEADLOCK_TIMEOUT):
                        outcomes.append("granted")
                except DeadlockError:
                    outcomes.append("deadlock")
                except LockTimeout:
                    outcomes.append("timeout")

        threads = [
            threading.Thread(target=member, args=("u", "v")),
            threading.Thread(target=member, args=("v", "u")),
        ]
        run_to_end(threads, HANG)
    assert "deadlock" not in outcomes
    assert "timeout" in outcomes
    assert no_edges_left(r)


@pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan"), "1", True])
def test_a_bad_deadlock_timeout_is_refused(redis_url: str, value: object) -> None:
    with pytest.raises(ValueError, match="deadlock_timeout"):
        LockClient(redis_url, deadlock_timeout=value)  # type: ignore[arg-type]


def test_the_victims_call_is_reported_once_with_its_error(client: LockClient) -> None:
    """The registry's gave-up event carries the error: the Django face's signal hears it."""
    events: list[Any] = []
    client.holds.on_gave_up(events.append)
    members = run_ring(client, ["e1", "e2"])
    victim = next(member for member in members if member.outcome == "deadlock")
    deadlocks = [event for event in events if event.deadlock is not None]
    assert len(deadlocks) == 1
    assert deadlocks[0].deadlock is victim.error
    assert deadlocks[0].name == victim.second


def test_a_waiter_on_a_cycle_it_is_not_part_of_waits_and_gets_its_lock(
    client: LockClient, r: redis.Redis
) -> None:
    """A third thread waits for a member's lock: the cycle breaks once, and it gets in."""
    barrier = threading.Barrier(3)
    members = [
        Member(client, "t1", "t2", barrier),
        Member(client, "t2", "t1", barrier),
    ]
    tail_outcome: list[str] = []

    def tail() -> None:
        barrier.wait(HANG)
        try:
            with client.lock("t1"):
                tail_outcome.append("granted")
        except DeadlockError:
            tail_outcome.append("deadlock")

    tail_thread = threading.Thread(target=tail)
    for thread in (*members, tail_thread):
        thread.start()
    for thread in (*members, tail_thread):
        thread.join(HANG)
        assert not thread.is_alive()
    assert_one_victim([member.outcome for member in members])
    assert tail_outcome == ["granted"]
    assert no_edges_left(r)


def test_a_dead_holder_is_waited_out_not_reported(r: redis.Redis, redis_url: str) -> None:
    """A holder that stopped (its lease runs out) never waits: no cycle, the waiter gets in."""
    with LockClient(redis_url, key_prefix="test", deadlock_timeout=0.2) as client:
        dead = client.lock("dead")
        # Taken and never released, as by a process that died: the lease ends it.
        assert dead.acquire(lease=1.5)
        outcome: list[str] = []

        def waiter() -> None:
            with client.lock("dead"):
                outcome.append("granted")

        thread = threading.Thread(target=waiter)
        thread.start()
        thread.join(HANG)
        assert outcome == ["granted"]
    assert no_edges_left(r)


def test_random_order_every_deadlock_is_broken_and_every_unit_finishes(
    r: redis.Redis, redis_url: str
) -> None:
    """Pairs of few locks in any order: cycles form again and again; none stays unbroken."""
    with LockClient(redis_url, key_prefix="test", deadlock_timeout=0.1) as client:
        names = [f"any:{i}" for i in range(3)]
        finished: list[int] = []
        broken: list[DeadlockError] = []

        def worker(seed: int) -> None:
            rng = random.Random(seed)
            for unit in range(8):
                first, second = rng.sample(names, 2)
                for _ in range(100):  # retried as a database's victim is
                    try:
                        with client.lock(first):
                            time.sleep(0.01)
                            with client.lock(second):
                                time.sleep(0.01)
                        finished.append(unit)
                        break
                    except DeadlockError as error:
                        broken.append(error)

        threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
        run_to_end(threads, 120, "a cycle was never broken")
    assert len(finished) == 4 * 8
    assert all(isinstance(error, DeadlockError) for error in broken)
    assert no_edges_left(r)


def test_no_check_and_no_edge_when_a_wait_is_short_or_there_is_none(
    client: LockClient, r: redis.Redis
) -> None:
    """Zero cost: uncontended calls and waits shorter than deadlock_timeout never walk."""
    lock = client.lock("quick")
    for _ in range(20):
        with lock:
            pass
    holding = threading.Event()

    def brief_holder() -> None:
        with client.lock("quick"):
            holding.set()
            time.sleep(DEADLOCK_TIMEOUT / 5)

    holder = threading.Thread(target=brief_holder)
    holder.start()
    assert holding.wait(HANG)
    with lock:  # waits about a fifth of deadlock_timeout
        pass
    holder.join(HANG)
    stats = r.info("commandstats")
    assert "cmdstat_hgetall" not in stats  # the walk's read of a lock (inside its script)
    assert no_edges_left(r)
