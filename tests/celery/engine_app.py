"""A Celery app that uses the engine alone: no Django, no celery_rlock.

Run by a real worker (``celery -A tests.celery.engine_app worker``): its
tasks take locks through :class:`django_rlock.core.LockClient`. Every task
run must still be a unit of work whose holds end with it.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from celery import Celery

from django_rlock.core import LockClient

app = Celery("rlock_engine_tests", set_as_current=False)
_clients: dict[int, LockClient] = {}


def configure(url: str) -> None:
    """Point the app at the test Redis (broker, results and locks)."""
    app.conf.update(
        broker_url=url,
        result_backend=url,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
    )


def client() -> LockClient:
    """This process's lock client (one per worker child)."""
    made = _clients.get(os.getpid())
    if made is None:
        made = _clients[os.getpid()] = LockClient(app.conf.broker_url, key_prefix="engine")
    return made


if "RLOCK_TEST_BROKER_URL" in os.environ:  # in the worker
    configure(os.environ["RLOCK_TEST_BROKER_URL"])


@app.task
def leaky_body(run: str) -> bool:
    """Takes lock ``engine:<run>`` and ends without releasing it."""
    return client().lock(f"engine:{run}").acquire(blocking=False)


@app.task
def reenter_probe(run: str) -> dict[str, Any]:
    """The next task on the child: takes ``engine:<run>`` and gives it back, reporting how."""
    lock = client().lock(f"engine:{run}")
    took = lock.acquire(blocking=False)
    seen: dict[str, Any] = {"took": took, "hold_count": lock.hold_count() if took else 0}
    if took:
        lock.release()
    seen["locked_after_release"] = lock.locked()
    seen["django_or_celery_rlock"] = sorted(
        name for name in ("celery_rlock", "django.conf") if name in sys.modules
    )
    return seen
