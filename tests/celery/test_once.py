"""once=True: one equal task queued or running; never stuck after a crash or revoke.

once="queued": one equal task queued; a run in progress lets one follow-up be queued.
"""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest
import redis
from celery import Celery
from celery.result import AsyncResult

from celery_rlock import AlreadyQueued, LockedTask
from tests.celery import app as test_app
from tests.celery.conftest import (
    WATCHDOG_TIMEOUT,
    intervals,
    open_gate,
    wait_started,
    wait_until_free,
)
from tests.celery.workers import Worker

pytestmark = pytest.mark.slow


def test_a_duplicate_is_refused_while_queued_and_running_and_accepted_after(
    worker: Worker, store: redis.Redis, run: str
) -> None:
    queued = test_app.once_task.apply_async((run,), {"gate": True}, countdown=0.5)
    with pytest.raises(AlreadyQueued) as refused:
        test_app.once_task.delay(run)
    assert refused.value.task_id == queued.id
    wait_started(store, run)
    with pytest.raises(AlreadyQueued) as refused:
        test_app.once_task.delay(run, gate=False)  # other arguments, same key
    assert refused.value.task_id == queued.id
    other = test_app.once_task.delay(f"{run}-other")  # another key is not a duplicate
    open_gate(store, run)
    queued.get(timeout=20)
    other.get(timeout=20)
    again = test_app.once_task.delay(run)
    assert again.get(timeout=20)["id"] == again.id


def test_once_on_duplicate_return_gives_the_queued_tasks_result(
    worker: Worker, store: redis.Redis, run: str
) -> None:
    first = test_app.once_returning.delay(run, gate=True)
    wait_started(store, run)
    duplicate = test_app.once_returning.delay(run, gate=True)
    assert isinstance(duplicate, AsyncResult)
    assert duplicate.id == first.id
    open_gate(store, run)
    assert duplicate.get(timeout=20)["id"] == first.id


def test_the_marker_of_a_killed_run_frees_within_the_watchdog_timeout(
    worker: Worker, store: redis.Redis, run: str
) -> None:
    test_app.once_task.delay(run, gate=True)
    started = wait_started(store, run)
    os.kill(started["pid"], signal.SIGKILL)
    killed_at = time.monotonic()
    while True:
        try:
            accepted = test_app.once_task.delay(run)
            break
        except AlreadyQueued:
            assert time.monotonic() - killed_at <= WATCHDOG_TIMEOUT + 0.5
            time.sleep(0.01)
    assert time.monotonic() - killed_at <= WATCHDOG_TIMEOUT + 0.5
    assert accepted.get(timeout=20)["id"] == accepted.id


def test_revoking_a_queued_task_frees_its_marker(
    worker: Worker, store: redis.Redis, run: str
) -> None:
    parked = f"parked-{uuid.uuid4().hex[:8]}"  # a queue nobody consumes yet
    queued = test_app.once_task.apply_async((run,), queue=parked)
    with pytest.raises(AlreadyQueued):
        test_app.once_task.delay(run)
    queued.revoke()
    control = test_app.app.control
    control.add_consumer(parked, destination=[worker.nodename], reply=True, timeout=5)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                accepted = test_app.once_task.delay(run)
                break
            except AlreadyQueued:
                assert time.monotonic() < deadline, "the revoked task's marker was never freed"
                time.sleep(0.02)
        assert accepted.get(timeout=20)["id"] == accepted.id
        assert queued.state == "REVOKED"
    finally:
        control.cancel_consumer(parked, destination=[worker.nodename], reply=True, timeout=5)


def test_a_retry_sent_with_throw_false_keeps_its_task_queued(
    worker: Worker, store: redis.Redis, run: str
) -> None:
    # The run returns after self.retry(throw=False): its task is queued again
    # (the retry), so an equal task is refused until the retry has run.
    countdown = 5.0
    first = test_app.once_retry_returned.delay(run, countdown)
    assert wait_started(store, run)["retries"] == 0
    wait_until_free(store, f"once:{run}", timeout=20)
    time.sleep(0.5)  # the run's end has moved its marker (just after the release)
    with pytest.raises(AlreadyQueued) as refused:
        test_app.once_retry_returned.delay(run, countdown)
    assert refused.value.task_id == first.id
    again = wait_started(store, run, timeout=countdown + 20)
    assert (again["id"], again["retries"]) == (first.id, 1)
    deadline = time.monotonic() + 20
    while True:  # the retry's run ends: equal tasks may be queued again
        try:
            accepted = test_app.once_retry_returned.delay(run)
            break
        except AlreadyQueued:
            assert time.monotonic() < deadline, "the marker was never freed"
            time.sleep(0.02)
    assert accepted.get(timeout=20)["id"] == accepted.id
    assert len(intervals(store, run)) == 3  # the run, its retry, the equal task


# -- once="queued": dedup while queued only ---------------------------------------------


def test_queued_mode_runs_exactly_one_follow_up_of_a_run_in_progress(
    worker: Worker, store: redis.Redis, run: str
) -> None:
    first = test_app.once_queued.delay(run, gate=True)
    wait_started(store, run)  # the first run holds its lock: it is no longer queued
    accepted, refused = [], []
    for _ in range(3):  # three changes made while it runs
        try:
            accepted.append(test_app.once_queued.delay(run))
        except AlreadyQueued as duplicate:
            refused.append(duplicate.task_id)
    assert len(accepted) == 1, "a run in progress must let one follow-up be queued"
    follow_up = accepted[0]
    assert refused == [follow_up.id, follow_up.id]
    open_gate(store, run)
    assert first.get(timeout=20)["id"] == first.id
    assert follow_up.get(timeout=20)["id"] == follow_up.id
    assert len(intervals(store, run)) == 2  # the run and its one follow-up
    again = test_app.once_queued.delay(run)  # nothing queued any more
    assert again.get(timeout=20)["id"] == again.id


def test_queued_mode_lets_a_task_enqueue_itself_from_its_body(
    worker: Worker, store: redis.Redis, run: str
) -> None:
    first = test_app.once_queued.delay(run, again=True)
    follow_up = first.get(timeout=20)["next"]  # refused (AlreadyQueued) under once=True
    assert test_app.once_queued.AsyncResult(follow_up).get(timeout=20)["id"] == follow_up
    assert len(intervals(store, run)) == 2


@pytest.mark.pure
@pytest.mark.parametrize("once", ["always", 1, "True", None])
def test_once_accepts_only_true_false_or_queued(once: object) -> None:
    app = Celery("once-definition-test", set_as_current=False)

    @app.task(base=LockedTask, shared=False, lock="o:{order_id}", once=once)  # type: ignore[untyped-decorator]
    def pay(order_id: int) -> None: ...

    with pytest.raises(ValueError, match=r"once must be True, False or 'queued', got"):
        pay.name  # noqa: B018 -- evaluating the lazy task binds and checks it


@pytest.mark.pure
@pytest.mark.parametrize("once", [True, False, "queued"])
def test_the_three_once_values_define_a_task(once: object) -> None:
    app = Celery("once-definition-test", set_as_current=False)

    @app.task(base=LockedTask, shared=False, lock="o:{order_id}", once=once)  # type: ignore[untyped-decorator]
    def pay(order_id: int) -> None: ...

    assert pay.name.endswith("pay")
    assert pay.once == once
