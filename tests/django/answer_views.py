"""Views whose lock is lost, or whose release fails, once their work is done.

For tests/django/test_view_answers.py. Each view does its work (a row in
:data:`NOTES`, written through Django's connection), then lets the test's
:data:`during_work` hook break its lock (a force-release, the lock server
stopped...) before it returns or raises.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import connection
from django.http import HttpRequest, HttpResponse

from django_rlock import locked, rlock

#: The table the views write to (made with raw SQL by the tests: the suite has no models).
NOTES = "rlock_answer_note"

#: Set by a test: what happens to the view's lock once its work is done.
during_work: Callable[[str], None] | None = None


def write_note(text: str) -> None:
    """The view's work: one row in :data:`NOTES`."""
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {NOTES} (text) VALUES (%s)", [text])


def _break(name: str) -> None:
    if during_work is not None:
        during_work(name)


@locked("note:{note}", timeout=0)
def note(request: HttpRequest, note: str) -> HttpResponse:
    write_note(note)
    _break(f"note:{note}")
    return HttpResponse(f"noted {note}", status=201)


@locked("note:{note}", timeout=0, busy_response="raise")
def note_or_raise(request: HttpRequest, note: str) -> HttpResponse:
    write_note(note)
    _break(f"note:{note}")
    return HttpResponse(f"noted {note}", status=201)


@locked("note:{note}", timeout=0, using="own")
def own_note(request: HttpRequest, note: str) -> HttpResponse:
    """The ``own`` alias: a redis-server of the test's own, which it may stop."""
    _break(f"note:{note}")
    return HttpResponse(f"noted {note}", status=201)


@locked("note:{note}", timeout=0)
def failing_note(request: HttpRequest, note: str) -> HttpResponse:
    _break(f"note:{note}")
    raise ValueError("the view's own failure")


@locked("note:{note}", timeout=0)
async def async_note(request: HttpRequest, note: str) -> HttpResponse:
    _break(f"note:{note}")
    return HttpResponse(f"noted {note}", status=201)


def with_rlock(request: HttpRequest, note: str) -> HttpResponse:
    """``with rlock()`` in the view: a loss escapes the block, to the middleware."""
    with rlock(f"note:{note}", timeout=0):
        _break(f"note:{note}")
    return HttpResponse(f"noted {note}", status=201)


async def async_with_rlock(request: HttpRequest, note: str) -> HttpResponse:
    async with rlock(f"note:{note}", timeout=0):
        _break(f"note:{note}")
    return HttpResponse(f"noted {note}", status=201)
