"""The Celery app of the elected-beat tests, run by real ``celery beat`` and worker processes.

Each process of a test reads the same environment:

``RLOCK_BEAT_BROKER_URL``   the broker (and where the worker records sends)
``RLOCK_BEAT_LOCK_URL``     the lock server (``rlock_url``); a beat whose connection a
                            test cuts gets a proxy's URL here. Unset: Django's RLOCKS
``RLOCK_BEAT_RUN``          the test's run id: the schedule's argument and the lock's name
``RLOCK_BEAT_WATCHDOG``     the watchdog timeout (seconds)
``RLOCK_BEAT_SCHEDULER``    the wrapped scheduler (default PersistentScheduler)
``DJANGO_SETTINGS_MODULE``  set for the Django-configured beats (tests/celery/beat_settings.py)

The one periodic task, ``beat.record``, runs every :data:`INTERVAL` seconds and
appends what it was sent with to ``btest:sends:<run>`` (a JSON object per run:
the slot and term headers of the elected beat, and when the worker ran it).
"""

from __future__ import annotations

import json
import os
import time

import redis
from celery import Celery, Task

from celery_rlock.beat import SLOT_HEADER, TOKEN_HEADER

if os.environ.get("DJANGO_SETTINGS_MODULE"):
    import django

    django.setup()  # before DatabaseScheduler touches its models

#: Seconds between two runs of the periodic task.
INTERVAL = 1.0

#: The queue the beats send to and the tests' own worker consumes.
QUEUE = "rlock-beat-tests"

#: The key prefix of the beats' locks and records.
KEY_PREFIX = "btest"

app = Celery("rlock_beat_tests", set_as_current=False)

_broker = os.environ.get("RLOCK_BEAT_BROKER_URL", "redis://127.0.0.1:1/2")
_run = os.environ.get("RLOCK_BEAT_RUN", "none")
app.conf.update(
    broker_url=_broker,
    broker_connection_retry_on_startup=True,
    task_default_queue=QUEUE,
    rlock_key_prefix=KEY_PREFIX,
    rlock_watchdog_timeout=float(os.environ.get("RLOCK_BEAT_WATCHDOG", "1.5")),
    rlock_beat_lock=f"beat:{_run}",
    beat_max_loop_interval=INTERVAL,
    beat_schedule={
        "record": {"task": "beat.record", "schedule": INTERVAL, "args": (_run,)},
    },
)
if os.environ.get("RLOCK_BEAT_LOCK_URL"):
    app.conf.rlock_url = os.environ["RLOCK_BEAT_LOCK_URL"]
if os.environ.get("RLOCK_BEAT_SCHEDULER"):
    app.conf.rlock_beat_scheduler = os.environ["RLOCK_BEAT_SCHEDULER"]

_store: list[redis.Redis] = []


@app.task(bind=True, name="beat.record")
def record(self: Task, run: str) -> None:
    """Append the send's slot and term to ``btest:sends:<run>``."""
    if not _store:
        _store.append(redis.Redis.from_url(_broker))
    sent = {
        "slot": getattr(self.request, SLOT_HEADER, None),
        "token": getattr(self.request, TOKEN_HEADER, None),
        "ran_at": time.time(),
    }
    _store[0].rpush(f"{KEY_PREFIX}:sends:{run}", json.dumps(sent))
