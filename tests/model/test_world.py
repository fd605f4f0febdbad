"""The model's world ends a run cleanly: what its owners hold is given back, however deep.

Found by the model soaks: two plain-lock examples and one read-write example
drew only acquires (Hypothesis's swarm testing turns rules off per example), so
one asyncio owner re-entered one name 11 and 13 times. The end of the run then
released each name ten times at most, and the leak check found the last holds
still renewed: counts 1 and 3, exactly the re-entries past ten. The library
was right; the bound was the model's.
"""

from __future__ import annotations

import pytest

from tests.model.world import RELEASE_RETRIES, Acquire, Config, World

pytestmark = [pytest.mark.faults, pytest.mark.slow]

#: One thread and one asyncio task, one lock and one read-write lock, no faults.
QUIET = Config(
    sync_clients=1,
    owners_per_client=1,
    async_owners=1,
    names=("a",),
    rw_names=("r",),
    faults=frozenset(),
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
