"""Two equal tasks never overlap, under every on_busy, on a real prefork worker."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery.result import AsyncResult

from django_rlock.core import LockClient, LockTimeout
from tests.celery import app as test_app
from tests.celery.conftest import (
    assert_no_overlap,
    intervals,
    open_gate,
    wait_for_state,
    wait_started,
)
from tests.celery.workers import Worker

pytestmark = pytest.mark.slow

TASKS = {
    "retry": test_app.critical_retry,
    "skip": test_app.critical_skip,
    "wait": test_app.critical_wait,
    "raise": test_app.critical_raise,
    "locked-wait": test_app.critical_decorated,
    # django_rlock.locked under @app.task does what celery_rlock.locked does.
    "django-locked": test_app.critical_django_decorated,
}
RETRYING = ("retry", "django-locked")
RUN_BOTH = ("retry", "wait", "locked-wait", "django-locked")


def outcome(result: AsyncResult) -> Any:
    return result.get(timeout=30, propagate=False)


@pytest.mark.parametrize("mode", list(TASKS))
def test_two_equal_tasks_sent_at_once_never_overlap(
    mode: str, worker: Worker, store: redis.Redis, run: str
) -> None:
    task = TASKS[mode]
    first, second = task.delay(run, hold=0.5), task.delay(run, hold=0.5)
    outcomes = [outcome(first), outcome(second)]
    ran = [value for value in outcomes if isinstance(value, dict) and "pid" in value]
    pairs = intervals(store, run)
    assert len(pairs) == len(ran) >= 1
    assert_no_overlap(pairs)
    if mode in RUN_BOTH:
        assert len(ran) == 2  # neither is dropped: the second runs after the first
        assert ran[0]["token"] != ran[1]["token"]


@pytest.mark.parametrize("mode", list(TASKS))
def test_a_task_sent_while_its_lock_is_held(
    mode: str, worker: Worker, store: redis.Redis, run: str
) -> None:
    task = TASKS[mode]
    holder = task.delay(run, gate=True)
    held = wait_started(store, run)
    contender = task.delay(run, gate=True)
    if mode == "skip":
        assert contender.get(timeout=20) == {
            "skipped": True,
            "reason": "lock busy",
            "lock": f"crit:{run}",
        }
    elif mode == "raise":
        with pytest.raises(LockTimeout) as raised:
            contender.get(timeout=20)
        # Results carry an exception's message, not its attributes (retry_after).
        assert f"lock 'crit:{run}' busy" in str(raised.value)
        # The holder's watchdog renews its lock: no "lease ends" (it would not be free then).
        assert "whose watchdog renews it until it is released" in str(raised.value)
        assert f"[{holder.id}]" in str(raised.value)  # the holding run, as rlock list shows it
    elif mode in RETRYING:
        wait_for_state(contender, "RETRY")
    open_gate(store, run, tokens=2)
    assert holder.get(timeout=20)["token"] == held["token"]
    if mode in RUN_BOTH:
        second = contender.get(timeout=20)
        assert second["token"] > held["token"]
        if mode in RETRYING:
            assert second["retries"] >= 1
    pairs = intervals(store, run)
    assert len(pairs) == (2 if mode in RUN_BOTH else 1)
    assert_no_overlap(pairs)
    log = worker.output()
    assert f"lock 'crit:{run}' acquired after waiting" in log
    assert f"lock 'crit:{run}' released after holding" in log
    verdict = {
        "retry": "retrying in",
        "django-locked": "retrying in",
        "skip": "skipped",
        "raise": "failing",
    }.get(mode)
    if verdict is not None:
        assert re.search(rf"lock 'crit:{run}' busy after waiting [0-9.]+s.*: {verdict}", log)


# -- the countdown of a busy retry follows the holder's age, not its lease -------------

#: The lease of the lock held elsewhere: what the countdown was before (about 28 s).
HOLDER_LEASE = 30.0
#: How long that lock has been held when the task finds it busy.
HOLDER_AGE = 2.0


@pytest.fixture(scope="module")
def django_worker(broker_url: str) -> Iterator[tuple[Worker, str]]:
    """A worker whose locks come from Django's RLOCKS, which keeps their hold times."""
    queue = "busy-django"
    env = {"DJANGO_SETTINGS_MODULE": "tests.celery.django_settings"}
    with Worker(broker_url, env=env, queue=queue, concurrency=1) as worker:
        yield worker, queue


def test_a_busy_retry_comes_back_after_the_holders_age_not_its_lease(
    django_worker: tuple[Worker, str], broker_url: str, run: str
) -> None:
    worker, queue = django_worker
    name = f"crit:{run}"
    # Another process holds the lock, with a long lease and no hold history.
    client = LockClient(broker_url, key_prefix="djtest")  # tests/celery/django_settings.py
    holder = client.lock(name)
    try:
        assert holder.acquire(lease=HOLDER_LEASE)
        time.sleep(HOLDER_AGE)
        result = test_app.critical_retry.apply_async((run,), queue=queue)
        countdown = _retry_countdown(worker, name)
        # About the holder's age so far (before b9e5590: its lease left, about 28 s).
        assert HOLDER_AGE - 0.5 <= countdown < HOLDER_LEASE / 2
        holder.release()
        started = result.get(timeout=HOLDER_LEASE / 2)  # back well before the lease ended
        assert started["retries"] == 1
    finally:
        client.close()


def _retry_countdown(worker: Worker, name: str, timeout: float = 20.0) -> float:
    """The countdown the worker logged for the busy lock ``name``."""
    pattern = re.compile(rf"lock '{re.escape(name)}' busy after waiting .*: retrying in ([0-9.]+)s")
    deadline = time.monotonic() + timeout
    while (found := pattern.search(worker.output())) is None:
        assert time.monotonic() < deadline, f"no busy retry of {name!r} logged"
        time.sleep(0.02)
    return float(found.group(1))
