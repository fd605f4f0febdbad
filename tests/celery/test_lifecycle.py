"""A task's lock through its whole life: long runs, retries, revokes, kills, time limits."""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis
from celery.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded

from django_rlock.core import LockTimeout
from django_rlock.core._process.holder import read_holder
from tests.celery import app as test_app
from tests.celery.conftest import (
    WATCHDOG_TIMEOUT,
    lock_key,
    wait_dead,
    wait_started,
    wait_until_free,
)
from tests.celery.workers import Worker

pytestmark = pytest.mark.slow

#: The issue's bound for a dead holder's lock: the watchdog timeout plus slack.
EXPIRY_BOUND = WATCHDOG_TIMEOUT + 0.5


def test_a_task_running_three_watchdog_timeouts_keeps_its_lock(
    worker: Worker, store: redis.Redis, run: str
) -> None:
    result = test_app.sleeper.delay(run, 3 * WATCHDOG_TIMEOUT + 0.5)
    wait_started(store, run)
    key = lock_key(f"life:{run}")
    finished = f"ctest:intervals:{run}"  # recorded by the body, before the release
    contender = None
    lowest_ttl = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ttl = store.pttl(key)
        if store.llen(finished):
            break
        assert ttl > 0, "the running task's lock key expired"
        lowest_ttl = ttl if lowest_ttl is None else min(lowest_ttl, ttl)
        if contender is None:
            # An equal task sent mid-run is refused: the lock is still exclusive.
            contender = test_app.sleeper.delay(run, 0)
        time.sleep(0.02)
    assert result.get(timeout=10) == {"lost": False}
    assert lowest_ttl is not None and lowest_ttl > 0
    assert contender is not None
    with pytest.raises(LockTimeout):
        contender.get(timeout=10)
    assert not store.exists(key)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def test_operators_see_which_task_holds_the_lock(
    worker: Worker, store: redis.Redis, run: str
) -> None:
    result = test_app.sleeper.delay(run, 1.0)
    wait_started(store, run)
    fields = {
        _text(name): _text(value) for name, value in store.hgetall(lock_key(f"life:{run}")).items()
    }
    holder = read_holder(fields)
    assert result.get(timeout=10) == {"lost": False}
    assert holder is not None
    assert (holder["task_id"], holder["task_name"]) == (result.id, test_app.sleeper.name)
    assert holder["pid"] != os.getpid()  # the worker's child, not this process


def test_retry_releases_and_the_retry_reacquires(
    worker: Worker, store: redis.Redis, run: str
) -> None:
    result = test_app.retrying.delay(run)
    first = wait_started(store, run)
    second = wait_started(store, run)
    assert result.get(timeout=20) == second
    assert (first["retries"], second["retries"]) == (0, 1)
    # A fresh grant each time (a lock leaked by the first attempt would be
    # re-entered by a retry landing in the same child: count 2, same token).
    assert first["hold_count"] == second["hold_count"] == 1
    assert second["token"] > first["token"]
    assert not store.exists(lock_key(f"retry:{run}"))


def test_revoke_terminate_frees_the_lock(worker: Worker, store: redis.Redis, run: str) -> None:
    result = test_app.sleeper.delay(run, 60)
    started = wait_started(store, run)
    result.revoke(terminate=True)
    wait_dead(started["pid"])
    assert wait_until_free(store, f"life:{run}", timeout=10) <= EXPIRY_BOUND
    assert result.state == "REVOKED"


def test_a_sigkilled_child_frees_its_lock_within_the_watchdog_timeout(
    worker: Worker, store: redis.Redis, run: str
) -> None:
    test_app.sleeper.delay(run, 60)
    started = wait_started(store, run)
    os.kill(started["pid"], signal.SIGKILL)
    assert wait_until_free(store, f"life:{run}", timeout=10) <= EXPIRY_BOUND


def test_the_hard_time_limit_frees_the_lock_within_the_watchdog_timeout(
    worker: Worker, store: redis.Redis, run: str
) -> None:
    result = test_app.sleeper.apply_async((run, 60), time_limit=1)
    started = wait_started(store, run)
    wait_dead(started["pid"])
    assert wait_until_free(store, f"life:{run}", timeout=10) <= EXPIRY_BOUND
    with pytest.raises(TimeLimitExceeded):
        result.get(timeout=10)


def test_the_soft_time_limit_releases_at_once(worker: Worker, store: redis.Redis, run: str) -> None:
    result = test_app.sleeper.apply_async((run, 60), soft_time_limit=0.5)
    started = wait_started(store, run)
    with pytest.raises(SoftTimeLimitExceeded):
        result.get(timeout=20)
    # The child lives on and its watchdog would keep a leaked lock alive: the
    # key is gone only because the run released it before reporting failure.
    assert not store.exists(lock_key(f"life:{run}"))
    os.kill(started["pid"], 0)  # the same child is still alive


def test_warm_shutdown_waits_for_the_task_and_releases(
    broker_url: str, store: redis.Redis, run: str
) -> None:
    queue = f"shutdown-{run}"
    with Worker(broker_url, concurrency=1, watchdog_timeout=30, queue=queue) as own:
        result = test_app.sleeper.apply_async((run, 1.0), queue=queue)
        wait_started(store, run)
        assert own.process is not None
        own.process.send_signal(signal.SIGTERM)
        assert own.wait_exit(timeout=30) == 0
        # The run finished (its interval is recorded) and released, long
        # before the 30 s watchdog timeout could have expired its key.
        assert store.llen(f"ctest:intervals:{run}") == 1
        assert not store.exists(lock_key(f"life:{run}"))
        assert result.get(timeout=10) == {"lost": False}
