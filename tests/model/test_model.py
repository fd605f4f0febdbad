"""The lock model, bounded: random owners and faults, invariants after every step.

Sync threads on two clients and asyncio tasks on a third, each client behind
its own fault proxy to a private redis-server, acquire (lease or watchdog,
blocking or not), re-enter, release and release what they do not hold, while
partitions, stalls, lost replies, CLIENT KILL and an operator's force-release
come at random. After every step the history is checked: no two owners ever
believed they held one name at one instant, fencing tokens grow in grant
order, releases raise what they must; after every example nothing grew.

The run is reproducible (``derandomize``, no example database) and bounded
(about 40 s); ``make soak`` runs the same machine for as long as asked. The
default config also restarts the server without persistence, FLUSHALLs it and
closes clients under live holds: the paths of the bugs fixed since, each
scripted in ``test_known_bugs.py``.
"""

from __future__ import annotations

import pytest

from tests.model.bounded import BOUNDED, run_bounded
from tests.model.world import Config

pytestmark = [pytest.mark.faults, pytest.mark.slow]


def test_model() -> None:
    operations, faults = run_bounded("model", Config())
    # The run did something: grants, and faults of several kinds.
    # One opening grant per example at least (machine.py), and more drawn.
    assert operations["acquire granted"] >= BOUNDED.max_examples
    assert len(faults) >= 4
