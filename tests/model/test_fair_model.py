"""The lock model on fair locks: the same owners, faults and invariants, with ``fair_lock``.

A fair lock is an RLock that grants in arrival order; under partitions, stalls,
lost replies, CLIENT KILL and force-release it must keep every invariant of
tests/model/test_model.py (one holder per name at any instant, tokens growing
in grant order, releases raising what they must, nothing left behind: no
lock, entry or queue once every hold has ended).
"""

from __future__ import annotations

import pytest

from tests.model.bounded import BOUNDED, run_bounded
from tests.model.world import Config

pytestmark = [pytest.mark.faults, pytest.mark.slow]


def test_fair_model() -> None:
    operations, faults = run_bounded("fair model", Config(fair=True))
    assert operations["acquire granted"] >= BOUNDED.max_examples  # one opening grant each
    assert len(faults) >= 4
