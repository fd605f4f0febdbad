"""``lock_permits``: at most N runs per key across a real prefork worker's processes.

The recipe of docs/semaphore.md: a task holds one of its tenant's 3 permits
for its whole run. A child process SIGKILLed mid-run stops renewing; its
permit comes back within the watchdog timeout.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from django_rlock.core import LockClient
from django_rlock.core._protocol.semaphore import permit_prefix, semaphore_keys
from tests.celery import app as test_app
from tests.celery.conftest import WATCHDOG_TIMEOUT, intervals, wait_started
from tests.celery.test_definition import define
from tests.celery.workers import Worker

pytestmark = pytest.mark.slow

QUEUE = "semaphore"


@pytest.fixture(scope="module")
def tenant_worker(broker_url: str) -> Iterator[Worker]:
    """Five processes: room for more runs than the tenant has permits."""
    with Worker(broker_url, watchdog_timeout=WATCHDOG_TIMEOUT, concurrency=5, queue=QUEUE) as w:
        yield w


def most_at_once(pairs: list[tuple[float, float]]) -> int:
    events = sorted([(start, 1) for start, _ in pairs] + [(stop, -1) for _, stop in pairs])
    inside = most = 0
    for _, step in events:
        inside += step
        most = max(most, inside)
    return most


def permit_holders(store: redis.Redis, name: str) -> set[str]:
    """The owners whose permit hash of semaphore ``name`` is alive."""
    keys = semaphore_keys("ctest", name)
    owners = [
        owner.decode() if isinstance(owner, bytes) else owner for owner in store.smembers(keys.hash)
    ]
    return {owner for owner in owners if store.exists(permit_prefix(keys) + owner)}


@pytest.mark.pure
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lock_permits": 0}, "lock_permits must be an int >= 1"),
        ({"lock_permits": "3"}, "lock_permits must be an int >= 1"),
        ({"lock_permits": 2, "once": True}, "once=True .* lock_permits"),
    ],
)
def test_lock_permits_is_checked_when_the_task_is_defined(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        define(lock="tenant:{order_id}", **options)


def test_at_most_three_runs_per_tenant_and_a_killed_runs_permit_comes_back(
    tenant_worker: Worker, store: redis.Redis, run: str
) -> None:
    name = f"tenant:{run}"
    for _ in range(5):
        test_app.tenant_call.apply_async((run,), {"gate": True}, queue=QUEUE)
    first = [wait_started(store, run) for _ in range(3)]
    assert len({started["pid"] for started in first}) == 3  # three processes
    with LockClient(store, key_prefix="ctest") as client:
        tenant = client.semaphore(name, 3)
        assert tenant.available() == 0
        # The other two keep going back to the queue: none starts while 3 run.
        time.sleep(1.5 * WATCHDOG_TIMEOUT)
        assert store.llen(f"ctest:started:{run}") == 0
        holders = permit_holders(store, name)
        assert len(holders) == 3

        # SIGKILL one run's process: nothing releases its permit, nothing renews
        # it. (A waiting run may take the freed permit at once: what is watched
        # is the hash of one of the three first holders.)
        os.kill(first[0]["pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        while holders <= permit_holders(store, name):
            assert time.monotonic() - killed_at < 10, "the dead run's permit never came back"
            time.sleep(0.02)
        came_back = time.monotonic() - killed_at
        assert came_back <= WATCHDOG_TIMEOUT + 0.5
        assert len(holders & permit_holders(store, name)) == 2  # the live two still hold theirs

        # Let every run finish (a gated run's wait is bounded by the test
        # store's socket timeout): the two waiting runs get permits and run.
        store.rpush(f"ctest:gate:{run}", *["go"] * 4)
        for _ in range(2):
            assert wait_started(store, run, timeout=30)["pid"] != first[0]["pid"]
        deadline = time.monotonic() + 30
        while len(intervals(store, run)) < 4:  # the killed run never finishes
            assert time.monotonic() < deadline, "the runs did not finish"
            time.sleep(0.05)
        assert most_at_once(intervals(store, run)) <= 3
        deadline = time.monotonic() + 10
        while tenant.available() != 3:
            assert time.monotonic() < deadline, "a permit was left held"
            time.sleep(0.05)
