"""A task body's leaked hold ends with its run (the work scope of core/leaks.py).

Before, a body that acquired and never released left the hold to the worker
child's thread: renewed for the child's life, and "re-entered" by the next task
on that child (hold count 2, no wait), whose own release then left it held.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from tests.celery import app as test_app
from tests.celery import bare_app
from tests.celery.conftest import lock_key
from tests.celery.workers import Worker

HANG = 30.0
#: Seconds after the result within which the run's end gives the hold back: half the
#: worker's watchdog timeout, so a hold left to expire instead is still told apart.
GIVEN_BACK_WITHIN = 0.5


@pytest.fixture
def child(broker_url: str, run: str) -> Iterator[Worker]:
    """A worker of one child on a queue of its own: consecutive tasks share that child."""
    with Worker(broker_url, concurrency=1, queue=f"leaks-{run}") as own:
        yield own


def test_a_leaked_hold_is_released_as_the_run_ends_and_never_reentered(
    child: Worker, run: str, store: redis.Redis
) -> None:
    queue = f"leaks-{run}"
    assert test_app.leaky_body.apply_async((run,), queue=queue).get(timeout=HANG) is True
    # Given back as the run ended, not a watchdog timeout (1 s: the key's life) or a
    # child's life later. Celery stores the result before task_postrun, where the
    # hold is given back, so the result may arrive a moment before the release.
    deadline = time.monotonic() + GIVEN_BACK_WITHIN
    while store.exists(lock_key(f"leak:{run}")) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not store.exists(lock_key(f"leak:{run}"))
    seen = test_app.reenter_probe.apply_async((run,), queue=queue).get(timeout=HANG)
    assert seen == {"took": True, "hold_count": 1, "locked_after_release": False}
    assert "leaked" in child.log.read_text()


#: Each flavour of an app that never imports celery_rlock: its worker's
#: environment, the key prefix of its locks, and what its worker has imported.
FLAVOURS = {
    # A Django project whose tasks use django_rlock's locks: the Django app
    # wires the task-run scope as it sees Celery.
    "django": (
        {"DJANGO_SETTINGS_MODULE": "tests.celery.django_settings"},
        "djtest",
        ["django.conf"],
    ),
    # A Celery app with no Django, using the engine: the package wires it as it loads.
    "engine": ({}, "engine", []),
}


@pytest.mark.parametrize("flavour", sorted(FLAVOURS))
def test_task_runs_end_their_holds_without_celery_rlock(
    broker_url: str, run: str, store: redis.Redis, flavour: str
) -> None:
    env, key_prefix, imported = FLAVOURS[flavour]
    bare_app.configure(broker_url)
    queue = f"bare-{flavour}-{run}"
    worker = Worker(
        broker_url, concurrency=1, queue=queue, env=env, app_module="tests.celery.bare_app"
    )
    with worker:
        assert bare_app.leaky_body.apply_async((run,), queue=queue).get(timeout=HANG) is True
        key = f"{key_prefix}:{{bare:{run}}}"
        deadline = time.monotonic() + GIVEN_BACK_WITHIN
        while store.exists(key) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not store.exists(key)
        seen = bare_app.reenter_probe.apply_async((run,), queue=queue).get(timeout=HANG)
        assert seen == {
            "took": True,
            "hold_count": 1,
            "locked_after_release": False,
            "imported": imported,
        }
        assert "leaked" in worker.output()
