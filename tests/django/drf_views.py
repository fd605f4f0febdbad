"""Django REST framework views locked with ``@locked`` (tests/django/test_drf.py).

Every way DRF users write a view: a function under ``@api_view`` (``@locked``
below it, where the function receives DRF's ``Request``, and above it), an
``APIView`` method decorated directly and through ``method_decorator``, and a
``ViewSet`` action. Each locks ``order:<id>`` with ``timeout=0`` and answers
``{"ok": <id>}`` when it gets the lock.
"""

# DRF ships no type hints (its stubs need a mypy plugin): its decorators and bases are Any.
# mypy: disallow-untyped-decorators=False, disallow-subclassing-any=False

from __future__ import annotations

from django.utils.decorators import method_decorator
from rest_framework import viewsets  # type: ignore[import-untyped]  # no hints, see above
from rest_framework.decorators import api_view  # type: ignore[import-untyped]
from rest_framework.request import Request  # type: ignore[import-untyped]
from rest_framework.response import Response  # type: ignore[import-untyped]
from rest_framework.views import APIView  # type: ignore[import-untyped]

from django_rlock import locked


@api_view(["POST"])
@locked("order:{order_id}", timeout=0)
def pay(request: Request, order_id: int) -> Response:
    """``@locked`` under ``@api_view``: it receives DRF's Request."""
    return Response({"ok": order_id, "data": request.data})


@locked("order:{order_id}", timeout=0)
@api_view(["POST"])
def pay_outside(request: Request, order_id: int) -> Response:
    """``@locked`` above ``@api_view``: it receives Django's HttpRequest."""
    return Response({"ok": order_id})


class PayView(APIView):
    """``@locked`` on an APIView method, directly: the request is its second argument."""

    @locked("order:{order_id}", timeout=0)
    def post(self, request: Request, order_id: int) -> Response:
        return Response({"ok": order_id})


@method_decorator(locked("order:{order_id}", timeout=0), name="post")
class DecoratedPayView(APIView):
    """``@locked`` through ``method_decorator``: the request is its first argument."""

    def post(self, request: Request, order_id: int) -> Response:
        return Response({"ok": order_id})


class OrderViewSet(viewsets.ViewSet):
    """A ViewSet's actions, one locked directly, one through ``method_decorator``."""

    @locked("order:{pk}", timeout=0)
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response({"ok": int(pk)})

    @method_decorator(locked("order:{pk}", timeout=0))
    def update(self, request: Request, pk: str) -> Response:
        return Response({"ok": int(pk)})
