"""lock_max_hold: a run that holds its lock past it has its hold declared lost."""

from __future__ import annotations

import json

import pytest
import redis

from tests.celery import app as test_app
from tests.celery.conftest import WATCHDOG_TIMEOUT
from tests.celery.workers import Worker

pytestmark = pytest.mark.slow


def test_a_run_held_past_lock_max_hold_is_lost(
    worker: Worker, store: redis.Redis, run: str
) -> None:
    # max_hold 1 s; the watchdog checks every WATCHDOG_TIMEOUT / 3 s: the loss is
    # declared within about 1.33 s of the grant, well before the body ends.
    hold = 1.0 + WATCHDOG_TIMEOUT + 0.5
    result = test_app.lost_past_max_hold.delay(run, hold)
    assert result.get(timeout=30) is True  # self.request.rlock.lost, at the body's end
    popped = store.blpop([f"ctest:lost:{run}"], timeout=20)  # after the run (task_postrun)
    assert popped is not None
    assert json.loads(popped[1]) is True
    log = worker.output()
    assert "it was held past its max_hold of 1s" in log
    assert f"lock 'lost:{run}' was lost while the task ran" in log
