"""The model's bounded runs: one reproducible setting, and a runner that adds up what a run did.

A bounded run is reproducible (``derandomize``, no example database) and
short; ``make soak`` runs the same machine for as long as asked.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from hypothesis import HealthCheck, Phase, settings

from tests.model.history import History
from tests.model.machine import run_model
from tests.model.world import Config

BOUNDED = settings(
    max_examples=8,
    stateful_step_count=25,
    deadline=None,
    derandomize=True,
    database=None,
    # No shrinking: a failure depends on timing, so a shrunk replay may pass;
    # the steps of the failing example are printed as they ran.
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
    print_blob=False,
)


class Figures(NamedTuple):
    """What every example of a run did, added up: outcomes of operations, and faults by kind."""

    operations: Counter[str]
    faults: Counter[str]


def run_bounded(label: str, config: Config, run: settings = BOUNDED) -> Figures:
    """Run the model of ``config`` under ``run``; print and return the figures of all its examples.

    The first violation found is raised, as ``run_model`` raises it.
    """
    histories: list[History] = []
    run_model(config, run, histories.append)
    operations = sum((history.operations for history in histories), start=History().operations)
    faults = sum((history.faults for history in histories), start=History().faults)
    print(f"FIGURES {label}: {dict(operations)}; faults {dict(faults)}")
    return Figures(operations, faults)
