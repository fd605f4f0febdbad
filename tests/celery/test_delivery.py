"""One run per message (issue 22, part 1): a message delivered again is dropped, not run.

Real prefork workers on the Redis broker. Bodies count their runs in Redis
(``ctest:runs:<run>``), the children record each delivery they get
(``task_prerun``) and each delivery dropped as a duplicate (the
``duplicate_dropped`` signal): see the last section of tests/celery/app.py.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from celery_rlock import _delivery as delivery
from celery_rlock._delivery import DONE_TTL_QUEUE_MARGIN, default_done_ttl
from django_rlock.core._protocol.names import escape
from tests.celery import app as test_app
from tests.celery.conftest import WATCHDOG_TIMEOUT, lock_key, open_gate, wait_dead, wait_started
from tests.celery.workers import Worker

pytestmark = pytest.mark.slow

#: The visibility timeout of the pair of workers below (seconds): short, so a
#: message nobody acknowledged comes back within the test.
VISIBILITY_TIMEOUT = 2.0

#: The default done_ttl of a worker with kombu's default transport options:
#: visibility_timeout 3600 + restore sweep 10 x 10 + queue margin 200.
DEFAULT_DONE_TTL = 3900.0

RESTORE_OPTIONS = ("unacked_restore_interval", "unacked_restore_throttle")


@pytest.fixture(scope="module")
def late_workers(broker_url: str) -> Iterator[tuple[str, list[Worker]]]:
    """Two single-child workers on a queue of their own, with a short visibility timeout."""
    queue = f"delivery-{uuid.uuid4().hex[:8]}"
    env = {"RLOCK_TEST_VISIBILITY_TIMEOUT": str(VISIBILITY_TIMEOUT)}
    workers = [
        Worker(broker_url, watchdog_timeout=WATCHDOG_TIMEOUT, concurrency=1, queue=queue, env=env)
        for _ in range(2)
    ]
    try:
        for worker in workers:
            worker.start(wait_ready=False)
        for worker in workers:
            worker.wait_ready(60)
        yield queue, workers
    finally:
        # Both warm shutdowns at once (each takes a couple of seconds).
        running = [w.process for w in workers if w.process and w.process.poll() is None]
        for process in running:
            process.send_signal(signal.SIGTERM)
        for process in running:
            process.wait(timeout=30)
        for worker in workers:
            worker.stop()
            worker.log.unlink(missing_ok=True)


def runs(store: redis.Redis, run: str) -> int:
    return int(store.get(f"ctest:runs:{run}") or 0)


def deliveries(store: redis.Redis, run: str) -> int:
    return int(store.llen(f"ctest:deliveries:{run}"))


def pop(store: redis.Redis, key: str, timeout: float) -> dict[str, Any]:
    """The next JSON line pushed on ``key``, in short BLPOPs (the client's socket timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        popped = store.blpop([key], timeout=1)
        if popped is not None:
            line: dict[str, Any] = json.loads(popped[1])
            return line
        assert time.monotonic() < deadline, f"nothing pushed on {key} within {timeout}s"


def wait_dropped(store: redis.Redis, run: str, timeout: float = 10.0) -> dict[str, Any]:
    """The next delivery of ``run`` dropped as a duplicate."""
    return pop(store, f"ctest:dropped:{run}", timeout)


def done_key(run: str, task_id: str) -> str:
    return f"{lock_key(f'delivery:{run}')}:done:{escape(task_id)}"


def stored_result(store: redis.Redis, task_id: str) -> bytes | None:
    """The result backend's record of ``task_id``, as stored."""
    raw = store.get(test_app.app.backend.get_key_for_task(task_id))
    assert raw is None or isinstance(raw, bytes)
    return raw


def wait_settled(store: redis.Redis, task_id: str, queue: str, timeout: float = 20.0) -> None:
    """Wait until no copy of ``task_id``'s message is queued or unacknowledged."""
    needle = task_id.encode()
    deadline = time.monotonic() + timeout
    while True:
        queued = any(needle in raw for raw in store.lrange(queue, 0, -1))
        unacked = any(needle in raw for raw in store.hvals("unacked"))
        if not (queued or unacked):
            return
        assert time.monotonic() < deadline, f"{task_id} still queued or unacked after {timeout}s"
        time.sleep(0.05)


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as listing:
        return [int(child) for child in listing.read().split()]


@pytest.mark.parametrize(
    "shape",
    [
        "hex",  # 32 hex digits
        "uuid",  # as Celery makes them: stored as its hex digits
        "long",  # a caller's own id, longer than a hash value keeps compact: stored whole
    ],
)
def test_a_delivery_while_its_run_goes_on_is_dropped_and_stores_nothing(
    worker: Worker, store: redis.Redis, run: str, shape: str
) -> None:
    task_id = {
        "hex": uuid.uuid4().hex,
        "uuid": str(uuid.uuid4()),
        "long": f"nightly-report:{'x' * 70}:{uuid.uuid4().hex}",
    }[shape]
    first = test_app.delivered.apply_async((run,), {"gate": True}, task_id=task_id)
    wait_started(store, run)
    # The same message again (what a broker's redelivery looks like), to the other child.
    test_app.delivered.apply_async((run,), {"gate": True}, task_id=task_id)
    assert wait_dropped(store, run) == {"id": task_id, "found": "running", "retries": 0}
    # Dropped with Ignore: no RETRY, no result stored over the run still going on.
    assert stored_result(store, task_id) is None
    open_gate(store, run)
    assert first.get(timeout=20)["id"] == task_id
    assert (runs(store, run), deliveries(store, run)) == (1, 2)


def test_a_delivery_after_its_run_ended_is_dropped_and_the_result_stays(
    worker: Worker, store: redis.Redis, run: str
) -> None:
    task_id = uuid.uuid4().hex
    test_app.delivered.apply_async((run,), task_id=task_id).get(timeout=20)
    result = stored_result(store, task_id)
    assert result is not None and b"SUCCESS" in result
    # The record of the run's end lives the default done_ttl, from the broker's
    # visibility timeout (kombu's default here), and then expires.
    assert DEFAULT_DONE_TTL - 60 < store.pttl(done_key(run, task_id)) / 1000 <= DEFAULT_DONE_TTL

    test_app.delivered.apply_async((run,), task_id=task_id)
    assert wait_dropped(store, run) == {"id": task_id, "found": "finished", "retries": 0}
    assert (runs(store, run), deliveries(store, run)) == (1, 2)
    assert stored_result(store, task_id) == result  # the first run's, untouched


def test_a_delivery_while_its_run_holds_a_permit_is_dropped(
    worker: Worker, store: redis.Redis, run: str
) -> None:
    task_id = uuid.uuid4().hex
    first = test_app.delivered_permit.apply_async((run,), {"gate": True}, task_id=task_id)
    wait_started(store, run)
    # A second permit is free, but the first run of this message holds one.
    test_app.delivered_permit.apply_async((run,), {"gate": True}, task_id=task_id)
    assert wait_dropped(store, run)["found"] == "running"
    open_gate(store, run)
    first.get(timeout=20)
    assert (runs(store, run), deliveries(store, run)) == (1, 2)
    semaphore_done = f"{lock_key(f'delivery:{run}')}:sem:done:{escape(task_id)}"
    assert 25 < store.pttl(semaphore_done) / 1000 <= 30  # lock_done_ttl=30


def test_a_retry_sent_while_its_run_holds_the_lock_still_runs(
    worker: Worker, store: redis.Redis, run: str
) -> None:
    # The retry reaches the other child while its own run still holds the lock:
    # that run ends with Retry (no done record), so the retry is no duplicate.
    result = test_app.delivered_retrying.delay(run)
    wait_started(store, run)
    deadline = time.monotonic() + 20
    while deliveries(store, run) < 2:
        assert time.monotonic() < deadline, "the retry was never delivered"
        time.sleep(0.01)
    open_gate(store, run)
    assert result.get(timeout=20)["retries"] == 1
    assert runs(store, run) == 2
    assert store.llen(f"ctest:dropped:{run}") == 0


@pytest.mark.parametrize("task", ["delivered_retry_returned", "delivered_retry_returned_decorated"])
def test_a_retry_sent_with_throw_false_by_a_run_that_returns_runs_once(
    worker: Worker, store: redis.Redis, run: str, task: str
) -> None:
    # self.retry(throw=False) sends the retry and returns it: the run goes on
    # and succeeds, and its message goes on in the retry. A done record
    # written for that run dropped the retry as a duplicate.
    result = getattr(test_app, task).delay(run)
    deadline = time.monotonic() + 20
    while runs(store, run) < 2 and store.llen(f"ctest:dropped:{run}") == 0:
        assert time.monotonic() < deadline, "the retry was never run nor dropped"
        time.sleep(0.02)
    assert store.llen(f"ctest:dropped:{run}") == 0, wait_dropped(store, run)
    first, again = wait_started(store, run), wait_started(store, run)
    assert (first["id"], first["retries"]) == (result.id, 0)
    assert (again["id"], again["retries"]) == (result.id, 1)
    # The retry's run is the message's last: it writes the done record.
    while not store.exists(done_key(run, result.id)):
        assert time.monotonic() < deadline, "the retry's run wrote no done record"
        time.sleep(0.02)
    # Celery stores the first run's SUCCESS and never overwrites a success:
    # the result is the run that returned, as Celery documents for throw=False.
    assert result.get(timeout=20)["retries"] == 0
    assert (runs(store, run), deliveries(store, run)) == (2, 2)


def test_a_task_whose_child_was_killed_runs_again(
    worker: Worker, store: redis.Redis, run: str
) -> None:
    # acks_late + reject_on_worker_lost puts the message back at once, while
    # the dead run's lock still lives (up to the watchdog timeout): the new
    # delivery waits that hold out instead of taking it for a live run.
    result = test_app.delivered_late.delay(run, gate=True)
    killed = wait_started(store, run)
    os.kill(killed["pid"], signal.SIGKILL)
    wait_dead(killed["pid"])
    again = wait_started(store, run)
    assert again["id"] == result.id and again["pid"] != killed["pid"]
    open_gate(store, run)
    assert result.get(timeout=20)["pid"] == again["pid"]
    assert runs(store, run) == 2
    assert store.llen(f"ctest:dropped:{run}") == 0


def test_a_visibility_timeout_redelivery_of_a_running_task_runs_it_once(
    late_workers: tuple[str, list[Worker]], store: redis.Redis, run: str
) -> None:
    # The measurement: an acks_late task running past the visibility
    # timeout is delivered again to another worker, and ran 3 times of 7.
    # The run holds until the test has seen the redelivery dropped: a loaded
    # machine's late restore sweep must not let the run end (and be
    # acknowledged) before the message is given out again.
    queue, _ = late_workers
    result = test_app.delivered_late.apply_async((run,), {"gate": True}, queue=queue)
    wait_started(store, run)
    assert wait_dropped(store, run, timeout=25)["found"] == "running"
    open_gate(store, run)
    result.get(timeout=20)
    wait_settled(store, result.id, queue)
    assert runs(store, run) == 1
    assert deliveries(store, run) >= 2
    # done_ttl follows the workers' visibility timeout (2 + sweep 1 x 1 + 200).
    expected = VISIBILITY_TIMEOUT + VISIBILITY_TIMEOUT / 2 + 200
    assert expected - 30 < store.pttl(done_key(run, result.id)) / 1000 <= expected


def test_the_default_done_ttl_counts_the_restore_options_only_where_kombu_reads_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = Celery(set_as_current=False)
    app.conf.broker_transport_options = {
        "visibility_timeout": 60,
        "unacked_restore_interval": 5,
        "unacked_restore_throttle": 2,
    }

    class Kombu57:
        from_transport_options = ("visibility_timeout", *RESTORE_OPTIONS)

    class Kombu56:  # no restore options: a look every 10 s, one scan in 10
        from_transport_options = ("visibility_timeout",)

    monkeypatch.setattr(delivery, "RedisChannel", Kombu57)
    assert default_done_ttl(app) == 60 + 5 * 2 + DONE_TTL_QUEUE_MARGIN
    monkeypatch.setattr(delivery, "RedisChannel", Kombu56)
    assert default_done_ttl(app) == 60 + 10 * 10 + DONE_TTL_QUEUE_MARGIN


def test_a_task_whose_worker_was_killed_runs_again_on_another_worker(
    late_workers: tuple[str, list[Worker]], store: redis.Redis, run: str
) -> None:
    queue, workers = late_workers
    result = test_app.delivered_late.apply_async((run,), {"gate": True}, queue=queue)
    killed = wait_started(store, run)
    victim = next(w for w in workers if w.process and killed["pid"] in children(w.process.pid))
    assert victim.process is not None
    os.kill(killed["pid"], signal.SIGKILL)
    os.kill(victim.process.pid, signal.SIGKILL)
    victim.process.wait(timeout=10)
    wait_dead(killed["pid"])
    # Nobody acknowledged it: the broker gives it to the other worker after the
    # visibility timeout, and the dead run's lock has expired or is waited out.
    again = pop(store, f"ctest:started:{run}", timeout=30)
    survivor = next(w for w in workers if w is not victim)
    assert survivor.process is not None and again["pid"] in children(survivor.process.pid)
    open_gate(store, run)
    assert result.get(timeout=20)["pid"] == again["pid"]
    assert runs(store, run) == 2


def test_a_django_project_counts_its_duplicates(
    broker_url: str, store: redis.Redis, run: str, tmp_path: Path
) -> None:
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.celery.django_settings",
        "RLOCK_TEST_METRICS": "prometheus",
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
    }
    queue = f"duplicates-{run}"
    task_id = uuid.uuid4().hex
    with Worker(broker_url, env=env, queue=queue, concurrency=2):
        first = test_app.delivered.apply_async((run,), {"gate": True}, task_id=task_id, queue=queue)
        wait_started(store, run)
        test_app.delivered.apply_async((run,), {"gate": True}, task_id=task_id, queue=queue)
        assert wait_dropped(store, run)["found"] == "running"
        open_gate(store, run)
        first.get(timeout=20)
        test_app.delivered.apply_async((run,), task_id=task_id, queue=queue)
        assert wait_dropped(store, run)["found"] == "finished"

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))  # type: ignore[no-untyped-call]  # untyped upstream
    for found in ("running", "finished"):
        labels = {"alias": "default", "lock": "delivery:{run}", "found": found}
        assert registry.get_sample_value("django_rlock_duplicates_total", labels) == 1, found
    assert runs(store, run) == 1
