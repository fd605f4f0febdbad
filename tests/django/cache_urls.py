"""A view locked with ``cache.lock()``, as django-redis code does (test_cache.py)."""

from __future__ import annotations

from django.core.cache import caches
from django.http import HttpRequest, HttpResponse
from django.urls import path


def report(request: HttpRequest, report_id: int) -> HttpResponse:
    """Builds report ``report_id`` under the ``shop`` cache's lock, without waiting for it."""
    lease = float(request.GET["lease"]) if "lease" in request.GET else None
    with caches["shop"].lock(f"report:{report_id}", timeout=lease, blocking_timeout=0):  # type: ignore[attr-defined]  # django_rlock.cache.RedisCache
        return HttpResponse("built")


urlpatterns = [path("report/<int:report_id>/", report)]
