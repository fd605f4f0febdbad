"""A locked task whose run is a deadlock's victim applies its on_busy, on a real prefork worker.

Two runs take their own lock (``dl:RUN:a``, ``dl:RUN:b``) and then, in their
body, the other's: a deadlock, broken by the lock client's detection
(``deadlock_timeout`` 1 s, the default) failing one of the two waits with
DeadlockError. The run it failed gives its lock back and applies on_busy.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis

from tests.celery import app as test_app
from tests.celery.workers import Worker

pytestmark = pytest.mark.slow

#: Seconds to wait for a task's result: only reached when something hangs.
RESULT = 60


def send_pair(task: Any) -> tuple[str, list[Any]]:
    run = uuid.uuid4().hex[:12]
    results = [task.delay(run, "a", "b"), task.delay(run, "b", "a")]
    return run, results


def texts(store: redis.Redis, key: str) -> list[str]:
    return sorted(
        raw.decode() if isinstance(raw, bytes) else str(raw) for raw in store.lrange(key, 0, -1)
    )


def test_the_victim_is_retried_and_both_runs_finish(worker: Worker, store: redis.Redis) -> None:
    run, results = send_pair(test_app.transfer_retry)
    outcomes = sorted(
        (result.get(timeout=RESULT) for result in results), key=lambda done: done["retries"]
    )
    assert [outcome["retries"] for outcome in outcomes] == [0, 1]  # one victim, retried once
    assert texts(store, f"ctest:done:{run}") == ["a", "b"]
    victim = outcomes[1]["first"]
    assert texts(store, f"ctest:attempts:{run}") == sorted(["a 0", "b 0", f"{victim} 1"])
    assert "deadlock detected" in worker.output()


def test_the_victim_is_skipped_with_on_busy_skip(worker: Worker, store: redis.Redis) -> None:
    run, results = send_pair(test_app.transfer_skip)
    outcomes = [result.get(timeout=RESULT) for result in results]
    skipped = [outcome for outcome in outcomes if outcome.get("skipped")]
    done = [outcome for outcome in outcomes if not outcome.get("skipped")]
    assert len(skipped) == 1 and len(done) == 1
    assert skipped[0]["reason"] == "deadlock"
    assert skipped[0]["lock"] == f"dl:{run}:{done[0]['first']}"  # the lock it waited for
    assert texts(store, f"ctest:done:{run}") == [done[0]["first"]]
