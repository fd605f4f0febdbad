"""The model's checks of semaphores and read-write locks can fail: each fires on a broken world.

Each test drives a world whose library is deliberately wrong in one way (a
semaphore that grants one permit too many, a read side that ignores the
writer, a write side that ignores the reader asking for it, a fencing counter
set and deleted by hand) through the shortest path to the fault, and expects
the model's own invariant to name it. The same path on the real world passes,
so what fires is the fault, not the path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from django_rlock.core import LockClient
from django_rlock.core._protocol.rwlock import RWKeys
from django_rlock.core.aio import AsyncLockClient
from tests.model.history import (
    DoubleHolder,
    ModelViolation,
    TokenWentBackwards,
    TooManyPermits,
    WrongUpgradeOutcome,
)
from tests.model.world import PREFIX, Acquire, Config, Operation, Release, World

pytestmark = [pytest.mark.faults, pytest.mark.slow]

#: Three sync owners on three clients, no faults: one semaphore and one read-write lock.
KINDS = Config(
    sync_clients=3,
    owners_per_client=1,
    async_owners=0,
    names=(),
    semaphores=("s",),
    permits=2,
    rw_names=("r",),
    faults=frozenset(),
)


class OverGrantingSemaphore(World):
    """Its semaphores grant one permit more than the model counts."""

    def make_lock(self, client: LockClient | AsyncLockClient, name: str, side: str) -> Any:
        if name in self.config.semaphores:
            return client.semaphore(name, self.config.permits + 1)
        return super().make_lock(client, name, side)


class BlindSide(World):
    """The ``blind`` side of its read-write locks is another name's: it ignores the other side."""

    blind = "read"

    def make_lock(self, client: LockClient | AsyncLockClient, name: str, side: str) -> Any:
        if name in self.config.rw_names and side == self.blind:
            return getattr(client.read_write_lock(f"{name}-elsewhere"), side)
        return super().make_lock(client, name, side)


class BlindWriter(BlindSide):
    blind = "write"


def violation_of(world: World, scenario: Callable[[World], None]) -> ModelViolation:
    """The violation the model finds once ``scenario`` has run on ``world`` (closed unchecked)."""
    try:
        with world:
            scenario(world)
            world.check()
    except ModelViolation as violation:
        return violation
    raise AssertionError("the model found no violation")


def do(world: World, owner: int, op: Operation) -> None:
    """Have ``owner`` carry out ``op`` and wait until it has."""
    world.submit(owner, op).result(30)


def three_permits_of_two(world: World) -> None:
    # Owner 0 re-enters: two permits of one hold; owner 1's is the third.
    do(world, 0, Acquire("s", lease=None, wait=None))
    do(world, 0, Acquire("s", lease=None, wait=None))
    do(world, 1, Acquire("s", lease=None, wait=None))


def test_a_semaphore_granting_a_permit_too_many_is_caught() -> None:
    found = violation_of(OverGrantingSemaphore(KINDS), three_permits_of_two)
    assert isinstance(found, TooManyPermits)
    assert "'s': 3 permits believed" in str(found)


def test_the_real_semaphore_refuses_the_third_permit() -> None:
    with World(KINDS) as world:
        three_permits_of_two(world)
        # The third permit comes once one of owner 0's is given back.
        do(world, 0, Release("s"))
        do(world, 1, Acquire("s", lease=None, wait=None))
        world.check()
        assert world.history.operations["permit acquire refused"] == 1
        assert world.history.operations["permit acquire granted"] == 3


def reader_during_a_write(world: World) -> None:
    do(world, 0, Acquire("r", lease=None, wait=None, side="write"))
    do(world, 1, Acquire("r", lease=None, wait=None, side="read"))


def test_a_reader_let_in_during_a_write_is_caught() -> None:
    found = violation_of(BlindSide(KINDS), reader_during_a_write)
    assert isinstance(found, DoubleHolder)
    assert "[thread-0.0 write token" in str(found)
    assert "[thread-1.0 read token 0" in str(found)


def test_the_real_read_write_lock_keeps_the_reader_out() -> None:
    with World(KINDS) as world:
        reader_during_a_write(world)
        do(world, 0, Acquire("r", lease=None, wait=None, side="read"))  # the writer may read
        do(world, 2, Acquire("r", lease=None, wait=None, side="write"))
        world.check()
        assert world.history.operations["read acquire refused"] == 1
        assert world.history.operations["read acquire granted"] == 1
        assert world.history.operations["write acquire refused"] == 1


def reader_asks_to_write(world: World) -> None:
    do(world, 0, Acquire("r", lease=None, wait=None, side="read"))
    do(world, 0, Acquire("r", lease=None, wait=0.3, side="write"))


def test_a_reader_granted_the_write_is_caught() -> None:
    found = violation_of(BlindWriter(KINDS), reader_asks_to_write)
    assert isinstance(found, WrongUpgradeOutcome)
    assert "thread-0.0 was granted the write of 'r' while its read lived" in str(found)


def test_the_real_read_write_lock_refuses_the_upgrade_at_once() -> None:
    with World(KINDS) as world:
        reader_asks_to_write(world)
        world.check()
        assert world.history.operations["write acquire LockUpgradeError"] == 1


def tokens_set_back_by_hand(world: World) -> None:
    fence = RWKeys.build(PREFIX, "r").fence
    do(world, 0, Acquire("r", lease=None, wait=None, side="write"))
    do(world, 0, Release("r", side="write"))
    # By hand, unrecorded (no revocation excuses it): a counter far ahead, then none.
    world.admin.set(fence, 10**18)
    do(world, 1, Acquire("r", lease=None, wait=None, side="write"))
    do(world, 1, Release("r", side="write"))
    world.admin.delete(fence)
    do(world, 2, Acquire("r", lease=None, wait=None, side="write"))


def test_write_tokens_going_backwards_are_caught() -> None:
    found = violation_of(World(KINDS), tokens_set_back_by_hand)
    assert isinstance(found, TokenWentBackwards)
    assert "thread-1.0 write token 1000000000000000000" in str(found)


def read_lost_at_close_then_write(world: World) -> None:
    do(world, 0, Acquire("r", lease=None, wait=None, side="read"))
    world.close_client(0)  # the watchdog read is declared lost; its key lives on
    do(world, 0, Acquire("r", lease=None, wait=None, side="write"))


def test_a_read_lost_at_close_does_not_refuse_its_owner_the_write() -> None:
    # Found by the model soak (kind mixed): the write was refused as an upgrade
    # until the lost read's key expired.
    with World(KINDS) as world:
        read_lost_at_close_then_write(world)
        world.check()
        assert world.history.operations["write acquire granted"] == 1
