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

import pytest
from hypothesis import settings

from tests.model.bounded import BOUNDED, run_bounded
from tests.model.world import Config

pytestmark = [pytest.mark.faults, pytest.mark.slow]

#: Read-write locks only: the lock names of the default config are left out.
RW_LOCKS = Config(names=(), rw_names=("r", "w"))


def test_rwlock_model() -> None:
    # About 20 s: fewer examples than the lock model's, as many steps.
    operations, faults = run_bounded("rwlock model", RW_LOCKS, settings(BOUNDED, max_examples=8))
    assert operations["write acquire granted"] >= 8  # one opening write per example
    assert operations["read acquire granted"] >= 1
    assert len(faults) >= 3
