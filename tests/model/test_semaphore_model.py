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

import logging
from collections.abc import Iterator

import pytest
from hypothesis import settings

from tests.model.history import History
from tests.model.machine import run_model
from tests.model.test_model import BOUNDED
from tests.model.world import Config

pytestmark = [pytest.mark.faults, pytest.mark.slow]

#: Semaphores only: the lock names of the default config are left out.
SEMAPHORES = Config(names=(), semaphores=("s", "t"), permits=2)


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    # Every fault makes the library log warnings; the invariants tell the story.
    logger = logging.getLogger("django_rlock")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


def test_semaphore_model() -> None:
    histories: list[History] = []
    # About 20 s: fewer examples than the lock model's, as many steps.
    run_model(SEMAPHORES, settings(BOUNDED, max_examples=7), histories.append)
    operations = sum((history.operations for history in histories), start=History().operations)
    faults = sum((history.faults for history in histories), start=History().faults)
    print(f"FIGURES semaphore model: {dict(operations)}; faults {dict(faults)}")
    assert operations["permit acquire granted"] >= 7  # one opening grant per example
    assert len(faults) >= 3
