"""URLs of the missing-middleware hints (tests/django/test_missing_pieces.py), one set per case."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import include, path
from django.views import View

import django_rlock
from django_rlock import locked, rlock


def pay(request: HttpRequest, order_id: int) -> HttpResponse:
    """Takes its lock inside the view: with no middleware, a busy lock is a 500."""
    with rlock(f"order:{order_id}", timeout=0):
        return HttpResponse("paid")


class RefundView(View):
    def post(self, request: HttpRequest, order_id: int) -> HttpResponse:
        with django_rlock.rlock(f"order:{order_id}", timeout=0):  # the qualified name
            return HttpResponse("refunded")


@locked("order:{order_id}", timeout=0)
def ship(request: HttpRequest, order_id: int) -> HttpResponse:
    """``@locked`` answers its own busy lock: no middleware needed."""
    return HttpResponse("shipped")


def note(request: HttpRequest, order_id: int) -> HttpResponse:
    """Calls a function of its own that is called rlock: not ours."""
    return HttpResponse(_local_rlock(order_id))


def _local_rlock(order_id: int) -> str:
    return str(order_id)


rlock_users = [
    path("pay/<int:order_id>/", pay),
    path("refund/<int:order_id>/", RefundView.as_view()),
]
clean = [path("ship/<int:order_id>/", ship), path("note/<int:order_id>/", note)]

urlpatterns = [path("orders/", include(rlock_users)), *clean]
