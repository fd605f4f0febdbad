"""The lock model on fair locks: the same owners, faults and invariants, with ``fair_lock``.

A fair lock is an RLock that grants in arrival order; under partitions, stalls,
lost replies, CLIENT KILL and force-release it must keep every invariant of
tests/model/test_model.py (one holder per name at any instant, tokens growing
in grant order, releases raising what they must, nothing left behind: no
lock, entry or queue once every hold has ended).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from tests.model.history import History
from tests.model.machine import run_model
from tests.model.test_model import BOUNDED
from tests.model.world import Config

pytestmark = [pytest.mark.faults, pytest.mark.slow]


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    # Every fault makes the library log warnings; the invariants tell the story.
    logger = logging.getLogger("django_rlock")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


def test_fair_model() -> None:
    histories: list[History] = []
    run_model(Config(fair=True), BOUNDED, histories.append)
    operations = sum((history.operations for history in histories), start=History().operations)
    faults = sum((history.faults for history in histories), start=History().faults)
    print(f"FIGURES fair model: {dict(operations)}; faults {dict(faults)}")
    assert operations["acquire granted"] >= BOUNDED.max_examples  # one opening grant each
    assert len(faults) >= 4
