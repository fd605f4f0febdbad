"""Owners and their scopes (issue 31), each path scripted: the model's ownership check judges.

Each test drives the model's world (real server, proxies, owners) through one
path of issue 31, "Ownership: a hold ends when its owner is done with it",
and lets :meth:`~tests.model.history.History.check_ownership` judge it from
the recorded history (scopes begun and ended, claims, the library's leak
reports, refused releases). The random machine reaches the same paths
(``tests/model/test_owner_model.py``, ``benchmarks/model_soak.py --kind owners``).

The paths that broke before the fixes of issue 31 (asyncio ``wait_for`` on
Python 3.11, ``shield`` and ``gather``; a lease hold of a unit of work
re-entered by the next unit; a lease hold re-entered with the watchdog and
released as leaked when its thread ended; a process whose main thread
returned) each failed with the model's :class:`OwnershipBroken` at commit
ebea227; the legitimate ends (a thread ending with a hold, a unit of work
ending with one, a garbage-collector pass over lock objects in reference
cycles) passed there and pass now.
"""

from __future__ import annotations

import time

import pytest

from tests.model.world import Acquire, Config, EndThread, NextUnit, Operation, Release, World

pytestmark = [pytest.mark.faults, pytest.mark.slow]

#: Thread 0 and 1 (own clients), task 2, unit worker 3; no faults.
OWNERS = Config(
    sync_clients=2,
    owners_per_client=1,
    async_owners=1,
    unit_workers=1,
    names=("a",),
    faults=frozenset(),
    thread_ends=True,
    gc_passes=True,
)
THREAD, RIVAL, TASK, WORKER = 0, 1, 2, 3


def do(world: World, owner: int, op: Operation) -> None:
    """Have ``owner`` carry out ``op`` and wait until it has."""
    world.submit(owner, op).result(30)


@pytest.mark.parametrize(
    "how",
    [
        "acquire",
        # Python 3.11 runs wait_for's call in a task of its own; 3.12 in the caller's.
        "wait_for",
        "shield",
        "gather",
    ],
)
def test_an_asyncio_task_owns_what_it_awaits(how: str) -> None:
    """The task that awaits the grant owns it, however the call is wrapped: it keeps
    the lock (a rival waits), and its own release goes through."""
    with World(OWNERS) as world:
        do(world, TASK, Acquire("a", lease=None, wait=1.5, how=how))
        # A leak release, were there one, comes as the inner task ends; past two
        # watchdog timeouts, a hold the watchdog stopped renewing has expired.
        time.sleep(2 * OWNERS.watchdog_timeout)
        do(world, RIVAL, Acquire("a", lease=None, wait=0.5))
        do(world, TASK, Release("a"))
        world.check()


def test_a_thread_that_ends_holding_gives_its_hold_back() -> None:
    """The thread's scope ended: the library reporting and releasing its hold is right."""
    with World(OWNERS) as world:
        do(world, THREAD, Acquire("a", lease=None, wait=None))
        do(world, THREAD, EndThread())
        do(world, RIVAL, Acquire("a", lease=None, wait=3.0))
        world.check()
        assert world.history.operations["acquire granted"] == 2
        assert world.history.leak_reports


def test_a_unit_of_work_that_ends_holding_gives_its_hold_back() -> None:
    with World(OWNERS) as world:
        do(world, WORKER, Acquire("a", lease=None, wait=None))
        do(world, WORKER, NextUnit())
        do(world, RIVAL, Acquire("a", lease=None, wait=0.5))
        do(world, WORKER, Acquire("a", lease=None, wait=1.5))  # a new grant, after the rival's
        do(world, RIVAL, Release("a"))
        world.check()
        assert world.history.leak_reports


def test_a_garbage_collector_pass_leaves_holds_in_reference_cycles_alone() -> None:
    """Lock objects left in reference cycles, collected on another thread while held."""
    with World(OWNERS) as world:
        do(world, THREAD, Acquire("a", lease=None, wait=None, how="cycle"))
        do(world, TASK, Acquire("a", lease=None, wait=None, how="cycle"))  # refused
        world.gc_pass(2)
        do(world, RIVAL, Acquire("a", lease=None, wait=0.5))
        do(world, THREAD, Release("a"))
        world.check()


def test_a_lease_hold_outlives_its_unit_of_work_and_the_next_unit_waits() -> None:
    """The next unit on the same thread re-enters the last unit's lease hold (same owner id)."""
    with World(OWNERS) as world:
        do(world, WORKER, Acquire("a", lease=2.0, wait=None))
        do(world, WORKER, NextUnit())
        do(world, WORKER, Acquire("a", lease=None, wait=None))  # must be refused
        world.check()


def test_a_lease_hold_re_entered_with_the_watchdog_stays_a_lease() -> None:
    """acquire(lease=N), then a watchdog re-entry (a helper's ``with``): the hold becomes
    a watchdog hold, so its thread's end reports it leaked and releases it before its lease."""
    with World(OWNERS) as world:
        do(world, THREAD, Acquire("a", lease=2.0, wait=None))
        do(world, THREAD, Acquire("a", lease=None, wait=None))
        do(world, THREAD, EndThread())
        do(world, RIVAL, Acquire("a", lease=None, wait=1.0))
        world.check()


def test_a_process_whose_main_thread_returned_keeps_its_hold_while_it_works() -> None:
    """The main thread took the lock, started a non-daemon thread, returned: the process
    still works, so its hold lives; a rival waits until the process is done."""
    with World(OWNERS) as world:
        assert world.main_thread_returns("a", works_for=1.5)
        do(world, RIVAL, Acquire("a", lease=None, wait=1.2))
        world.check()
