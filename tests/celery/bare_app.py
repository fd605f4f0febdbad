"""A Celery app that never imports celery_rlock: its tasks take locks themselves.

Run by a real worker (``celery -A tests.celery.bare_app worker``), as one of:

* a Django project's app (``DJANGO_SETTINGS_MODULE=tests.celery.django_settings``:
  ``django_rlock`` in INSTALLED_APPS, the test Redis in RLOCKS): the tasks
  use ``locks["default"]``;
* a Celery app with no Django: the tasks use the engine, a
  :class:`django_rlock.core.LockClient` of their own.

Either way every task run must be a unit of work whose holds end with it.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from celery import Celery

from django_rlock.core import LockClient, RLock

app = Celery("rlock_bare_tests", set_as_current=False)
_clients: dict[int, LockClient] = {}


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


def _lock(name: str) -> RLock:
    if os.environ.get("DJANGO_SETTINGS_MODULE"):
        from django_rlock import locks  # noqa: PLC0415 -- after the worker's django.setup()

        return locks["default"].lock(name)
    client = _clients.get(os.getpid())  # one per worker child
    if client is None:
        client = _clients[os.getpid()] = LockClient(app.conf.broker_url, key_prefix="engine")
    return client.lock(name)


@app.task
def leaky_body(run: str) -> bool:
    """Takes lock ``bare:<run>`` and ends without releasing it."""
    return _lock(f"bare:{run}").acquire(blocking=False)


@app.task
def reenter_probe(run: str) -> dict[str, Any]:
    """The next task on the child: takes ``bare:<run>`` and gives it back, reporting how."""
    lock = _lock(f"bare:{run}")
    took = lock.acquire(blocking=False)
    seen: dict[str, Any] = {"took": took, "hold_count": lock.hold_count() if took else 0}
    if took:
        lock.release()
    seen["locked_after_release"] = lock.locked()
    seen["imported"] = sorted(
        name for name in ("celery_rlock", "django.conf") if name in sys.modules
    )
    return seen
