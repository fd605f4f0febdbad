"""on_unavailable: a task whose lock server cannot be reached is retried ("retry", the
default) or fails ("fail"), and what it raises or logs is LockUnavailableError.

The worker's lock server (``rlock_url``) is a redis-server of its own, apart from the
broker, stopped and started again by the tests while the broker stays up.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from celery.result import AsyncResult

from celery_rlock import LockedTask
from celery_rlock._guard import unavailable_countdown
from django_rlock._web.responses import UNAVAILABLE_RETRY_AFTER
from django_rlock.core import LockUnavailableError
from tests.celery import app as test_app
from tests.celery.conftest import wait_for_state
from tests.celery.workers import Worker
from tests.servers import RedisServer, free_port

pytestmark = pytest.mark.slow

QUEUE = "unavailable"


@pytest.fixture(scope="module")
def lock_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def lock_worker(broker_url: str, lock_server: RedisServer) -> Iterator[Worker]:
    env = {"RLOCK_TEST_RLOCK_URL": lock_server.url}
    with Worker(broker_url, env=env, queue=QUEUE) as worker:
        yield worker


@pytest.fixture
def server_down(lock_server: RedisServer) -> Iterator[RedisServer]:
    """The lock server stopped for the test (started again after it, whatever happened)."""
    lock_server.stop()
    try:
        yield lock_server
    finally:
        if lock_server.process is None:
            lock_server.start()


def send(task: Any, run: str) -> AsyncResult:
    return task.apply_async((run,), queue=QUEUE)


def test_retry_requeues_until_the_lock_server_is_back(
    lock_worker: Worker, server_down: RedisServer, store: redis.Redis, run: str
) -> None:
    results = [
        send(test_app.unavailable_retry, run),
        send(test_app.unavailable_decorated_retry, run),
    ]
    for result in results:
        wait_for_state(result, "RETRY")  # before this change: FAILURE at once
    server_down.start()
    for result in results:
        started = result.get(timeout=30)
        assert started["id"] == result.id
        assert started["retries"] >= 1
    log = lock_worker.output()
    assert f"cannot acquire lock 'unavailable:{run}'" in log
    assert "LockUnavailableError" in log
    assert "is unreachable" in log and ": retrying in 1.000s" in log


def test_retry_past_max_retries_fails_with_lock_unavailable_error(
    lock_worker: Worker, server_down: RedisServer, run: str
) -> None:
    result = send(test_app.unavailable_retried_once, run)
    assert _failure(result) == "LockUnavailableError"


@pytest.mark.parametrize("task", ["unavailable_fail", "unavailable_decorated_fail"])
def test_fail_fails_at_once_with_lock_unavailable_error(
    lock_worker: Worker, server_down: RedisServer, run: str, task: str
) -> None:
    result = send(getattr(test_app, task), run)
    assert _failure(result) == "LockUnavailableError"
    assert result.info is not None
    assert f"cannot acquire lock 'unavailable:{run}'" in str(result.info)


def _failure(result: AsyncResult) -> str:
    """The name of the exception ``result`` failed with.

    Read from the stored traceback: the JSON result backend rebuilds an exception
    as ``cls(message)``, which LockUnavailableError (``server=`` is a required
    keyword) refuses, so ``result.get()`` raises a plain Exception naming it.
    """
    result.get(timeout=30, propagate=False)
    assert result.state == "FAILURE", result.state
    last = (result.traceback or "").strip().splitlines()[-1]
    return last.split(":", 1)[0].rsplit(".", 1)[-1]


def test_called_outside_a_worker_run_it_raises() -> None:
    app = Celery("unavailable-direct", set_as_current=False)
    app.conf.rlock_url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there

    @app.task(base=LockedTask, shared=False, lock="direct:{n}")  # type: ignore[untyped-decorator]
    def direct(n: int) -> int:
        return n

    with pytest.raises(LockUnavailableError, match="cannot acquire lock 'direct:1'"):
        direct(1)


def test_the_default_countdown_and_celerys_back_off() -> None:
    app = Celery("unavailable-countdown", set_as_current=False)

    @app.task(bind=True, shared=False)  # type: ignore[untyped-decorator]
    def plain(self: Any) -> None: ...

    @app.task(bind=True, shared=False, retry_backoff=3, retry_jitter=False)  # type: ignore[untyped-decorator]
    def backing_off(self: Any) -> None: ...

    assert unavailable_countdown(plain) == UNAVAILABLE_RETRY_AFTER == 5
    backing_off.push_request(retries=2)
    try:
        assert unavailable_countdown(backing_off) == 3 * 2**2
    finally:
        backing_off.pop_request()
