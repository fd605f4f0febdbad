"""A lock lost by the end of a run is reported, never put in place of the run's outcome.

The lock server restarts while the run releases (the release finds the key
gone: the restart took it), or another client force-releases the lock while
the body runs. Either way the task's own result or exception stands, the log
and ``self.request.rlock.lost`` say the lock was lost (and, in a Django
project, the ``lock_lost`` signal), unless the task asks ``on_lost="fail"``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery.result import AsyncResult

from django_rlock.core import LockLostError
from tests.celery import app as test_app
from tests.celery.conftest import open_gate, wait_started
from tests.celery.workers import Worker
from tests.servers import RedisServer

pytestmark = pytest.mark.slow

#: Seconds the lock server stays down after the body ended: the release's first
#: attempts fail, a later one (after 0.1 + 0.3 + 1.0 s of pauses) finds it back.
DOWNTIME = 0.5


@pytest.fixture(scope="module")
def lock_server() -> Iterator[RedisServer]:
    """The Celery-only worker's lock server, apart from the broker: it is restarted."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def lock_worker(broker_url: str, lock_server: RedisServer) -> Iterator[tuple[Worker, str]]:
    queue = "lost-celery"
    env = {"RLOCK_TEST_RLOCK_URL": lock_server.url}
    with Worker(broker_url, env=env, queue=queue, concurrency=1) as worker:
        yield worker, queue


@pytest.fixture(scope="module")
def django_worker(broker_url: str) -> Iterator[tuple[Worker, str]]:
    queue = "lost-django"
    env = {"DJANGO_SETTINGS_MODULE": "tests.celery.django_settings"}
    with Worker(broker_url, env=env, queue=queue, concurrency=1) as worker:
        yield worker, queue


def _body_done(store: redis.Redis, run: str, timeout: float = 20.0) -> None:
    # The body records its interval just before it returns (or raises).
    deadline = time.monotonic() + timeout
    while not store.llen(f"ctest:intervals:{run}"):
        assert time.monotonic() < deadline, f"the body of {run} never finished"
        time.sleep(0.005)


def _end_with_a_restart(store: redis.Redis, lock_server: RedisServer, run: str) -> None:
    """Take the lock server down as the body ends; bring it back (empty) mid-release."""
    wait_started(store, run)
    lock_server.stop()
    open_gate(store, run)
    _body_done(store, run)
    time.sleep(DOWNTIME)
    lock_server.start()


def _lost_after_the_run(store: redis.Redis, run: str) -> Any:
    popped = store.blpop([f"ctest:lost:{run}"], timeout=20)
    assert popped is not None, "task_postrun never recorded the run"
    return json.loads(popped[1])


def _send(task: Any, run: str, queue: str) -> AsyncResult:
    return task.apply_async((run,), queue=queue)


@pytest.mark.parametrize("task", ["lost_returning", "lost_decorated"])
def test_a_restart_during_the_release_keeps_the_result_and_reports_the_loss(
    lock_worker: tuple[Worker, str],
    lock_server: RedisServer,
    store: redis.Redis,
    run: str,
    task: str,
) -> None:
    worker, queue = lock_worker
    result = _send(getattr(test_app, task), run, queue)
    _end_with_a_restart(store, lock_server, run)
    assert result.get(timeout=30) == "the body's result"
    assert result.state == "SUCCESS"
    assert _lost_after_the_run(store, run) is True
    assert f"lock 'lost:{run}' was lost while the task ran" in worker.output()


def test_a_restart_during_the_release_keeps_the_bodys_own_exception(
    lock_worker: tuple[Worker, str], lock_server: RedisServer, store: redis.Redis, run: str
) -> None:
    _, queue = lock_worker
    result = _send(test_app.lost_raising, run, queue)
    _end_with_a_restart(store, lock_server, run)
    with pytest.raises(ValueError, match="the body's own error"):
        result.get(timeout=30)
    assert _lost_after_the_run(store, run) is True


@pytest.mark.parametrize("task", ["lost_failing", "lost_decorated_failing"])
def test_on_lost_fail_fails_a_run_whose_lock_was_lost(
    lock_worker: tuple[Worker, str],
    lock_server: RedisServer,
    store: redis.Redis,
    run: str,
    task: str,
) -> None:
    _, queue = lock_worker
    result = _send(getattr(test_app, task), run, queue)
    _end_with_a_restart(store, lock_server, run)
    with pytest.raises(LockLostError, match="on_lost"):
        result.get(timeout=30)
    assert _lost_after_the_run(store, run) is True


def test_a_lock_force_released_mid_run_is_reported_through_the_signal(
    django_worker: tuple[Worker, str], store: redis.Redis, run: str
) -> None:
    worker, queue = django_worker
    result = _send(test_app.lost_returning, run, queue)
    wait_started(store, run)
    key = f"djtest:{{lost:{run}}}"  # tests/celery/django_settings.py's KEY_PREFIX
    assert store.delete(key) == 1  # another client takes the lock away
    open_gate(store, run)
    assert result.get(timeout=30) == "the body's result"
    assert _lost_after_the_run(store, run) is True
    deadline = time.monotonic() + 10
    while True:
        kinds = [json.loads(raw)[0] for raw in store.lrange(f"ctest:signals:lost:{run}", 0, -1)]
        if "lost" in kinds and "released" in kinds:
            break
        assert time.monotonic() < deadline, f"signals: {kinds}"
        time.sleep(0.02)
    assert kinds.count("lost") == 1
    assert f"lock 'lost:{run}' was lost while the task ran" in worker.output()


def test_a_run_that_kept_its_lock_is_not_lost(
    lock_worker: tuple[Worker, str], store: redis.Redis, run: str
) -> None:
    _, queue = lock_worker
    result = _send(test_app.lost_failing, run, queue)
    wait_started(store, run)
    open_gate(store, run)
    assert result.get(timeout=30) == "the body's result"
    assert _lost_after_the_run(store, run) is False
