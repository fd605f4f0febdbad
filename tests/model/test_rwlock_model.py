"""The model on read-write locks: owners read, write, and ask to write while reading.

Two read-write lock names; sync threads on two clients and asyncio tasks on
a third take the ``read`` or the ``write`` side (re-entering, reading while
writing, asking to write while reading), release, and release what they do
not hold, under every fault of the lock model. After every step: a write
belief overlaps no other owner's read or write belief of its name, write
tokens grow in grant order, a reader asking to write gets LockUpgradeError
(an expected outcome) and nobody else does, releases raise what they must;
after every example nothing grew.
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

#: Read-write locks only: the lock names of the default config are left out.
RW_LOCKS = Config(names=(), rw_names=("r", "w"))


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    # Every fault makes the library log warnings; the invariants tell the story.
    logger = logging.getLogger("django_rlock")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


def test_rwlock_model() -> None:
    histories: list[History] = []
    # About 20 s: fewer examples than the lock model's, as many steps.
    run_model(RW_LOCKS, settings(BOUNDED, max_examples=8), histories.append)
    operations = sum((history.operations for history in histories), start=History().operations)
    faults = sum((history.faults for history in histories), start=History().faults)
    print(f"FIGURES rwlock model: {dict(operations)}; faults {dict(faults)}")
    assert operations["write acquire granted"] >= 8  # one opening write per example
    assert operations["read acquire granted"] >= 1
    assert len(faults) >= 3
