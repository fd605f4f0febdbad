"""Views that leave a lock behind, for tests/django/test_leaks.py."""

from __future__ import annotations

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
