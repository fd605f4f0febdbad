"""Views that leave a lock behind, for tests/django/test_leaks.py."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse

from django_rlock import locks


def leaky(request: HttpRequest, name: str) -> HttpResponse:
    """Takes lock ``name`` and returns without releasing it (the bug the leak check catches)."""
    locks["default"].lock(name).acquire()
    return HttpResponse("took it")


async def leaky_async(request: HttpRequest, name: str) -> HttpResponse:
    """The same in an async view: the hold belongs to the request's task."""
    await locks["default"].async_lock(name).__aenter__()
    return HttpResponse("took it")


async def leaky_executor(request: HttpRequest, name: str) -> HttpResponse:
    """An async view whose sync helper, run on an executor thread, keeps lock ``name``.

    ``sync_to_async(thread_sensitive=False)`` runs it on a thread of asgiref's
    pool, which lives on after the request: the request's end must end the hold.
    """
    await sync_to_async(locks["default"].lock(name).acquire, thread_sensitive=False)()
    return HttpResponse("took it")


def throttled(request: HttpRequest, name: str) -> HttpResponse:
    """Does its work at most once per 4-second lease: a throttle, as docs/migrating.md shows."""
    if not locks["default"].lock(name, lease=4).acquire(blocking=False):
        return HttpResponse("throttled", status=429)
    return HttpResponse("did it")
