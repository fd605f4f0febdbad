"""A deadlock between two views under ``ATOMIC_REQUESTS``, on PostgreSQL and two WSGI workers.

Each request (tests/django/deadlock_views.py) locks ``a`` then ``b``, or ``b``
then ``a``, and records each lock it took as a row, inside its request's
transaction. The lock it took first is bound to that transaction
(``transaction="auto"``): kept until COMMIT or ROLLBACK, so the two requests
deadlock. Detection fails one of the two waits with DeadlockError inside the
atomic block: its transaction rolls back (none of its rows is committed) and
releases its first lock, so the other request goes on and commits. The victim
answers 409 with a Retry-After, through LockErrorMiddleware (``with rlock()``)
or ``@locked`` (a locked function of the view).
"""

from __future__ import annotations

import http.client
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections

from tests import django_settings
from tests.django.conftest import HANG
from tests.django.deadlock_views import MEET, STEPS
from tests.django.test_transactions import wsgi_workers
from tests.postgres import PostgresServer, settings_for_child
from tests.threads import run_to_end

ON_POSTGRES = pytest.mark.django_db(transaction=True, databases=["default", "pg"])

#: The workers' RLOCK_DEADLOCK_TIMEOUT (seconds).
DEADLOCK_TIMEOUT = 0.5


@pytest.fixture
def steps(postgres_server: PostgresServer) -> Iterator[None]:
    """The table of steps on "pg", dropped after the test."""
    with connections["pg"].cursor() as cursor:
        cursor.execute(f"CREATE TABLE {STEPS} (run text, who text, step text)")
    yield
    with connections["pg"].cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {STEPS}")


def committed_steps(run: str) -> list[tuple[str, str]]:
    with connections["pg"].cursor() as cursor:
        cursor.execute(f"SELECT who, step FROM {STEPS} WHERE run = %s ORDER BY who, step", [run])
        return [(str(who), str(step)) for who, step in cursor.fetchall()]


def get(port: int, path: str) -> tuple[int, dict[str, str]]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=MEET + HANG)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        return response.status, dict(response.getheaders())
    finally:
        connection.close()


@ON_POSTGRES
@pytest.mark.parametrize("view", ["transfer", "transfer-locked"])
def test_the_victim_rolls_back_and_the_other_view_commits(
    steps: None, rlocks: dict[str, Any], view: str
) -> None:
    pg = {**settings_for_child(connections["pg"].settings_dict), "ATOMIC_REQUESTS": True}
    config = {
        "settings": {
            "DATABASES": {
                "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
                "pg": pg,
            },
            "RLOCKS": {"default": rlocks["default"]},
            "RLOCK_DEADLOCK_TIMEOUT": DEADLOCK_TIMEOUT,
            "ROOT_URLCONF": "tests.django.deadlock_urls",
            "MIDDLEWARE": [
                *django_settings.MIDDLEWARE,
                "django_rlock.middleware.LockErrorMiddleware",
            ],
        }
    }
    run = uuid.uuid4().hex[:8]
    answers: dict[str, tuple[int, dict[str, str]]] = {}
    with wsgi_workers(2, config) as ports:

        def call(port: int, first: str, second: str) -> None:
            path = f"/{view}/{run}/{first}/{second}/?db=pg"
            answers[f"{first}>{second}"] = get(port, path)

        threads = [
            threading.Thread(target=call, args=(ports[0], "a", "b")),
            threading.Thread(target=call, args=(ports[1], "b", "a")),
        ]
        started = time.monotonic()
        run_to_end(threads, MEET + 2 * HANG, "a request still waits for its answer")
        elapsed = time.monotonic() - started
    statuses = {who: status for who, (status, _headers) in answers.items()}
    print(f"{view}: {statuses} in {elapsed:.3f}s (deadlock_timeout {DEADLOCK_TIMEOUT}s)")
    assert sorted(statuses.values()) == [200, 409]
    winner = next(who for who, status in statuses.items() if status == 200)
    victim = next(who for who, status in statuses.items() if status == 409)
    assert int(answers[victim][1]["Retry-After"]) >= 1
    # The victim's rows were rolled back with its transaction; the winner's committed.
    first, second = winner.split(">")
    assert committed_steps(run) == sorted([(winner, first), (winner, second)])
    assert elapsed < DEADLOCK_TIMEOUT + HANG
