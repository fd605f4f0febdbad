"""Views of the LockErrorMiddleware tests (tests/django/test_middleware.py).

Each takes its lock with ``rlock()`` (or ``semaphore()``) inside the view, as
user code does, and lets the lock's errors escape to the middleware.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from django_rlock import locked, rlock, semaphore


def order(request: HttpRequest, order_id: int) -> HttpResponse:
    with rlock(f"order:{order_id}", timeout=0):
        return HttpResponse("ok")


async def async_order(request: HttpRequest, order_id: int) -> HttpResponse:
    async with rlock(f"order:{order_id}", timeout=0):
        return HttpResponse("ok")


def mem_order(request: HttpRequest, order_id: int) -> HttpResponse:
    """The LocMem alias (its own BUSY_RESPONSE may differ from the default alias's)."""
    with rlock(f"order:{order_id}", using="mem", timeout=0):
        return HttpResponse("ok")


def page(request: HttpRequest, slug: str) -> HttpResponse:
    with rlock(f"page:{slug}", timeout=0):
        return HttpResponse("ok")


async def async_page(request: HttpRequest, slug: str) -> HttpResponse:
    async with rlock(f"page:{slug}", timeout=0):
        return HttpResponse("ok")


@locked("page:{slug}", timeout=0)
def locked_page(request: HttpRequest, slug: str) -> HttpResponse:
    return HttpResponse("ok")


def partner(request: HttpRequest, tenant: int) -> HttpResponse:
    with semaphore(f"partner:{tenant}", 1, timeout=0):
        return HttpResponse("ok")


def broken(request: HttpRequest) -> HttpResponse:
    raise ValueError("not a lock error")
