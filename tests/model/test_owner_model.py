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

:data:`OWNERS` keeps off the paths of issue 31 that are still open (each
scripted in ``test_ownership_bugs.py``): asyncio ``wait_for``/``shield``/
``gather``, lease holds in units of work, a lease hold re-entered with the
watchdog, a child process whose main thread returns. :data:`OPEN` opens them
all, and the model finds a violation there: a strict xfail until the library
is fixed, then a regression run like the other.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.model.bounded import BOUNDED, run_bounded
from tests.model.history import OwnershipBroken
from tests.model.world import FAULTS, WAYS, Config

pytestmark = [pytest.mark.faults, pytest.mark.slow]

#: Threads that end, units of work, GC passes; the faults that keep locks on the server
#: but lost replies: their moment is not known, so each would excuse the rest of its run.
OWNERS = Config(
    sync_clients=2,
    owners_per_client=1,
    async_owners=1,
    unit_workers=2,
    names=("a", "b"),
    faults=FAULTS - {"drop_reply", "swallow_reply"},
    mixed_reentry=False,
    thread_ends=True,
    unit_leases=False,
    gc_passes=True,
)

#: Every path of issue 31 open: asyncio ways, unit leases, mixed re-entry, processes; no
#: faults (none is needed on these paths, and each would excuse what came near it).
OPEN = replace(
    OWNERS,
    faults=frozenset(),
    ways=WAYS,
    unit_leases=True,
    mixed_reentry=True,
    processes=True,
)


def test_owner_model() -> None:
    operations, _faults = run_bounded("owner model", OWNERS)
    assert operations["acquire granted"] >= BOUNDED.max_examples  # one opening grant each
    assert operations["thread ended"] + operations["unit of work ended"] >= 1
    assert operations["gc pass"] >= 1


@pytest.mark.xfail(strict=True, raises=OwnershipBroken, reason="issue 31, open")
def test_owner_model_on_the_open_paths() -> None:
    run_bounded("owner model, open paths", OPEN)
