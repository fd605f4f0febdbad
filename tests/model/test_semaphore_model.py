"""The model on semaphores: owners take and give back permits under every fault.

Two semaphore names of 2 permits each; sync threads on two clients and
asyncio tasks on a third take permits (a re-acquire takes another one), give
them back, and give back what they do not hold, while partitions, stalls,
lost replies, CLIENT KILL, an operator's force-release, FLUSHALL and restarts
without persistence come at random. After every step: at no instant do the
permits the owners believe they hold (not lost, local deadline not passed,
release not begun) add up to more than 2 per name, except where a fault took
permits away on the server; releases raise what they must; after every
example nothing grew (permit hashes and waiting sets expire, the index stays
within its bound).
"""

from __future__ import annotations

import pytest
from hypothesis import settings

from tests.model.bounded import BOUNDED, run_bounded
from tests.model.world import Config

pytestmark = [pytest.mark.faults, pytest.mark.slow]

#: Semaphores only: the lock names of the default config are left out.
SEMAPHORES = Config(names=(), semaphores=("s", "t"), permits=2)


def test_semaphore_model() -> None:
    # About 20 s: fewer examples than the lock model's, as many steps.
    operations, faults = run_bounded(
        "semaphore model", SEMAPHORES, settings(BOUNDED, max_examples=7)
    )
    assert operations["permit acquire granted"] >= 7  # one opening grant per example
    assert len(faults) >= 3
