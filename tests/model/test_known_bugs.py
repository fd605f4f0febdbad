"""The bugs of issue "A holder always knows before a rival can hold", each as a script.

Each script drives the model's world (real server, proxies, owners) through
the shortest path to one bug and lets the model's own invariants judge it.
Before the fixes each one failed with the invariant named in its docstring
(DoubleHolder, TokenWentBackwards, HolderNotTold); now they are regression
tests. The random machine reaches the same paths (``benchmarks/model_soak.py``
reports how fast it found them on the old code).
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from tests.model.world import Acquire, Config, Operation, Release, World

pytestmark = [pytest.mark.faults, pytest.mark.slow]

#: Two sync owners, each on its own client (so a partition cuts one off).
TWO_CLIENTS = Config(sync_clients=2, owners_per_client=1, async_owners=0, names=("a", "b"))


def do(world: World, owner: int, op: Operation) -> None:
    """Have ``owner`` carry out ``op`` and wait until it has."""
    world.submit(owner, op).result(30)


def test_mixed_lease_and_watchdog_hold_under_a_partition() -> None:
    with World(replace(TWO_CLIENTS, mixed_reentry=True)) as world:
        do(world, 0, Acquire("a", lease=2.0, wait=None))
        do(world, 0, Acquire("a", lease=None, wait=None))  # re-entry: now watchdog-renewed
        time.sleep(0.4)  # a renewal sets the key to the watchdog timeout (0.9 s)
        rival = world.submit(1, Acquire("a", lease=None, wait=1.5))
        world.partition(0, seconds=1.5)
        rival.result(30)
        world.check()


def test_acquire_retried_after_its_reply_was_lost() -> None:
    with World(replace(TWO_CLIENTS, retry_unanswered=True)) as world:
        do(world, 0, Acquire("b", lease=0.3, wait=None))  # loads the scripts
        do(world, 0, Release("b"))
        world.lose_reply(0, "swallow")
        do(world, 0, Acquire("a", lease=1.0, wait=None))  # granted; the reply never came
        time.sleep(0.5)
        do(world, 0, Acquire("a", lease=1.0, wait=None))  # the retry: reported granted
        do(world, 1, Acquire("a", lease=None, wait=1.5))  # granted when the key expires
        world.check()


@pytest.mark.parametrize("loss", ["flushall", "restart"])
def test_tokens_after_the_server_lost_its_data(loss: str) -> None:
    with World(TWO_CLIENTS) as world:
        for _ in range(3):
            do(world, 0, Acquire("a", lease=None, wait=None))
            do(world, 0, Release("a"))
        if loss == "flushall":
            world.flushall()
        else:
            world.restart(down_for=0.0)
        do(world, 1, Acquire("a", lease=None, wait=1.5))
        do(world, 1, Release("a"))
        world.check()


def test_closing_a_client_with_live_holds_tells_their_owners() -> None:
    with World(TWO_CLIENTS) as world:
        do(world, 0, Acquire("a", lease=None, wait=None))
        do(world, 0, Acquire("b", lease=2.0, wait=None))
        world.close_client(0)
        world.check()


def test_a_release_that_never_ran_is_not_re_entered_as_a_new_grant() -> None:
    """TokenWentBackwards: the client gave up a hold whose release never reached Redis,
    and the owner's next acquire re-entered it (the old token, as a new grant)."""
    with World(TWO_CLIENTS) as world:
        do(world, 0, Acquire("a", lease=2.0, wait=None))
        world.links[0].proxy.blackhole()
        do(world, 0, Release("a"))  # times out: the hold is still on the server
        world.links[0].proxy.heal()
        do(world, 0, Acquire("a", lease=2.0, wait=None))
        do(world, 0, Release("a"))
        do(world, 1, Acquire("a", lease=None, wait=None))  # the owner's release freed it
        world.check()
        assert world.history.operations["acquire granted"] == 3


def test_a_lease_hold_left_on_a_closed_client_is_re_entered_through_the_new_one() -> None:
    """The finding's own path, a false alarm of the model (TokenWentBackwards): a closed
    client's fixed-lease hold runs on, still the owner's (owner ids are per thread or
    task, not per client), so its acquire through the new client re-enters it."""
    with World(TWO_CLIENTS) as world:
        do(world, 0, Acquire("a", lease=2.0, wait=None))
        world.close_client(0)
        do(world, 0, Acquire("a", lease=0.8, wait=None))
        world.check()
