"""The model's world keeps its own books right: what it reports is the library's doing.

Each test here is a report of the model soaks that turned out to be the
model's, not the library's, and fails on the model as it was:

- Two plain-lock examples and one read-write example drew only acquires
  (Hypothesis's swarm testing turns rules off per example), so one asyncio
  owner re-entered one name 11 and 13 times. The end of the run released each
  name ten times at most, and the leak check found the last holds still
  renewed: counts 1 and 3, exactly the re-entries past ten.
- An operator force-released a lock just after its owner had started a
  release: the release found the hold gone, and the model called that a hold
  dropped while its owner believed in it, since the revocation came after the
  release began (an owner that releases one of two holds believes on).
- A semaphore's holder started releasing its permit, the reply was lost, and
  another owner got the permit while the call waited out its socket timeout:
  the model counted the permit as believed until the release returned, three
  permits of two. An owner stops counting on a permit, or on its last hold of
  a lock, as it starts giving it back.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from django_rlock.core import LockClient, RLock
from django_rlock.core.aio import AsyncLockClient
from tests.model.world import RELEASE_RETRIES, Acquire, Config, Release, World

pytestmark = [pytest.mark.faults, pytest.mark.slow]

#: One thread and one asyncio task, one lock and one read-write lock, no faults.
#: Timeouts a loaded machine does not reach (a second, not a quarter): no fault
#: is under test, and beside two CPU hogs a quarter-second reply went unanswered
#: (two of 13 re-entries were not counted as granted).
QUIET = Config(
    sync_clients=1,
    owners_per_client=1,
    async_owners=1,
    names=("a",),
    rw_names=("r",),
    faults=frozenset(),
    socket_timeout=1.0,
    watchdog_timeout=3.0,
)

#: More holds than the end of a run would retry if it did not count them.
DEEP = RELEASE_RETRIES + 3


@pytest.mark.parametrize("owner", [0, 1], ids=["thread", "task"])
@pytest.mark.parametrize(("name", "side"), [("a", ""), ("r", "write"), ("r", "read")])
def test_the_end_of_a_run_gives_back_every_hold_of_a_deep_re_entry(
    owner: int, name: str, side: str
) -> None:
    world = World(QUIET)
    with world:
        for _ in range(DEEP):
            assert world.submit(owner, Acquire(name, None, None, side)).result(30) is None
        world.check()
        assert world.history.operations[_granted(name, side)] == DEEP
        [hold] = world.owners[owner].holds(name, side)
        assert hold.count == DEEP
    # Closing checked that no key, hold, connection or thread was left.
    assert world.closed
    assert not world.history.violations


def _granted(name: str, side: str) -> str:
    return f"{side} acquire granted" if side else "acquire granted"


#: One thread owner on one client, no faults: the faults a test needs are done by hand.
ONE_THREAD = Config(sync_clients=1, owners_per_client=1, async_owners=0, faults=frozenset())


class SlowToRelease(World):
    """Its owners' releases start (for the model) a while before their call is sent."""

    def make_lock(self, client: LockClient | AsyncLockClient, name: str, side: str) -> Any:
        assert isinstance(client, LockClient)  # thread owners only
        return SlowRLock(client, name)


class SlowRLock(RLock):
    """An RLock whose release waits ``DELAY`` before its call: nothing else changes."""

    DELAY = 0.3

    def release(self) -> None:
        time.sleep(self.DELAY)
        super().release()


@pytest.mark.parametrize("holds", [1, 2])
def test_a_force_release_racing_a_release_is_the_operator_s_doing(holds: int) -> None:
    with SlowToRelease(ONE_THREAD) as world:
        for _ in range(holds):
            assert world.submit(0, Acquire("a", 2.0, None)).result(30) is None
        releasing = world.submit(0, Release("a"))
        time.sleep(SlowRLock.DELAY / 3)  # the release has started; its call is not sent yet
        world.force_release("a")
        assert releasing.result(30) is None
        world.check()
        assert world.history.operations["release LockLostError"] == 1
        [belief] = world.history.beliefs
        # The last hold's belief ends as its release starts; with another hold
        # held meanwhile, it ends when the release finds the lock lost.
        assert (belief.released_at is None) == (holds > 1)
        assert belief.lost_at is not None


#: One thread owner per client, no faults (the lost reply is armed by hand).
THREE_CLIENTS = Config(
    sync_clients=3,
    owners_per_client=1,
    async_owners=0,
    names=("a",),
    semaphores=("s",),
    permits=2,
    faults=frozenset(),
)


@pytest.mark.parametrize("name", ["s", "a"], ids=["semaphore", "lock"])
def test_what_a_release_gives_back_is_not_believed_while_its_reply_is_lost(name: str) -> None:
    with World(THREE_CLIENTS) as world:
        # Once through, so the scripts are loaded: the lost reply is the release's
        # own, not a NOSCRIPT before it ran.
        assert world.submit(0, Acquire(name, 2.0, None)).result(30) is None
        assert world.submit(0, Release(name)).result(30) is None
        # Fixed leases: no renewal may take the lost reply meant for the release.
        holders = [0, 1] if name == "s" else [0]
        for holder in holders:
            assert world.submit(holder, Acquire(name, 2.0, None)).result(30) is None
        waiting = world.submit(2, Acquire(name, 2.0, 1.5))
        time.sleep(0.2)  # the waiter is registered
        world.lose_reply(0, "swallow")
        releasing = world.submit(0, Release(name))
        # The release ran on the server: the waiter is granted while the
        # releasing call still waits for its reply (a 0.25 s socket timeout).
        assert waiting.result(30) is None
        assert not releasing.done()
        world.check()
        assert releasing.result(30) is None
        world.check()
        granted = "permit acquire granted" if name == "s" else "acquire granted"
        assert world.history.operations[granted] == len(holders) + 2  # and the first one through
        released = (
            "permit release LockUnavailableError" if name == "s" else "release LockUnavailableError"
        )
        assert world.history.operations[released] == 1
