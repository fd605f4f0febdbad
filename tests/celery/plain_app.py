"""A Django project's Celery app that never imports celery_rlock: its tasks use ``rlock()``.

Run by a real worker (``celery -A tests.celery.plain_app worker``) with
``DJANGO_SETTINGS_MODULE=tests.celery.django_settings`` (``django_rlock`` in
INSTALLED_APPS, the test Redis in RLOCKS), as a project that uses
django_rlock's locks in its task bodies and no celery_rlock task base. Every
task run must still be a unit of work whose holds end with it.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from celery import Celery

app = Celery("rlock_plain_tests", set_as_current=False)


def configure(url: str) -> None:
    """Point the app at the test Redis (broker and results)."""
    app.conf.update(
        broker_url=url,
        result_backend=url,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
    )


if "RLOCK_TEST_BROKER_URL" in os.environ:  # in the worker
    configure(os.environ["RLOCK_TEST_BROKER_URL"])


@app.task
def leaky_body(run: str) -> bool:
    """Takes lock ``plain:<run>`` and ends without releasing it."""
    from django_rlock import locks  # noqa: PLC0415 -- after the worker's django.setup()

    return locks["default"].lock(f"plain:{run}").acquire(blocking=False)


@app.task
def reenter_probe(run: str) -> dict[str, Any]:
    """The next task on the child: takes ``plain:<run>`` and gives it back, reporting how."""
    from django_rlock import locks  # noqa: PLC0415

    lock = locks["default"].lock(f"plain:{run}")
    took = lock.acquire(blocking=False)
    seen: dict[str, Any] = {"took": took, "hold_count": lock.hold_count() if took else 0}
    if took:
        lock.release()
    seen["locked_after_release"] = lock.locked()
    seen["celery_rlock_imported"] = "celery_rlock" in sys.modules
    return seen
