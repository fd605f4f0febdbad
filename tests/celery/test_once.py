"""once=True: one equal task queued or running; never stuck after a crash or revoke."""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest
import redis
from celery.result import AsyncResult

from celery_rlock import AlreadyQueued
from tests.celery import app as test_app
from tests.celery.conftest import WATCHDOG_TIMEOUT, open_gate, wait_started
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
