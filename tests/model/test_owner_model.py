"""The lock model with owners that end their scopes: ownership judged from the history.

Besides the lock model's threads and asyncio tasks (tests/model/test_model.py)
and its faults, thread owners end while holding (a new thread takes each
one's place), long-lived worker threads serve units of work one after another
(``work_started``/``work_ended("request")``, as Django's request signals and
Celery's task-run signals call them) and end some holding, owners acquire
through lock objects left in reference cycles, and ``gc.collect()`` runs on a
thread of its own at random. After every step, besides the lock model's
invariants, :meth:`~tests.model.history.History.check_ownership`: no rival
granted while a scope claimed the name, no hold reported leaked (and given
back) while its scope claimed it, no owner's release refused while it claimed
the hold, faults aside.

:data:`OWNERS` opens every path of issue 31 (each scripted in
``test_ownership_bugs.py``): asyncio ``wait_for``/``shield``/``gather``, lease
holds in units of work, a lease hold re-entered with the watchdog, a child
process whose main thread returns. Before the fixes of issue 31 the model
found violations there within the first example of :data:`QUIET` (a rival
granted while a child process still worked; a ``gather`` grant recorded for
another task); now both runs pass. :data:`QUIET` injects no fault: each fault
excuses what comes near it, so the ownership check judges most there.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import settings

from tests.model.bounded import BOUNDED, run_bounded
from tests.model.world import FAULTS, WAYS, Config

pytestmark = [pytest.mark.faults, pytest.mark.slow]

#: Threads that end, units of work, GC passes, every asyncio way, leases in units, mixed
#: re-entry, child processes; the faults that keep locks on the server but lost replies:
#: their moment is not known, so each would excuse the rest of its run.
OWNERS = Config(
    sync_clients=2,
    owners_per_client=1,
    async_owners=1,
    unit_workers=2,
    names=("a", "b"),
    faults=FAULTS - {"drop_reply", "swallow_reply"},
    ways=WAYS,
    thread_ends=True,
    unit_leases=True,
    gc_passes=True,
    processes=True,
)

#: The same owners, no fault: nothing excuses a hold ended early.
QUIET = replace(OWNERS, faults=frozenset())

#: Fewer examples for each of the two runs: each within the lock model's time.
HALF = settings(BOUNDED, max_examples=4)


def test_owner_model() -> None:
    operations, faults = run_bounded("owner model", OWNERS, HALF)
    assert operations["acquire granted"] >= HALF.max_examples  # one opening grant each
    assert operations["thread ended"] + operations["unit of work ended"] >= 1
    assert len(faults) >= 2


def test_owner_model_without_faults() -> None:
    operations, _faults = run_bounded("owner model, no faults", QUIET, HALF)
    assert operations["acquire granted"] >= HALF.max_examples
    assert operations["gc pass"] >= 1
    assert operations["process main thread granted"] >= 1
