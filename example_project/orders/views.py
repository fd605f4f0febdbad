"""The shop's JSON API: pay and refund an order, read it, start a customer's report.

Both write views change the order under its lock, ``order:<id>``, the same
lock the ``capture_payment`` task takes, so a web request and a background
task never change one order at the same time:

* ``pay`` takes it with ``with rlock(...)``: it waits (up to 10 s) for its turn;
* ``refund`` takes it with ``@locked(...)`` and ``timeout=0``: when the order
  is busy it answers ``409 Conflict`` with ``Retry-After`` at once.
"""

from __future__ import annotations

import json

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST
from django_rlock import locked, rlock

from orders.models import Customer, Order
from orders.tasks import build_report


def _amount(request: HttpRequest) -> int:
    """The ``amount`` (cents) of a JSON request body."""
    try:
        amount = json.loads(request.body or b"{}")["amount"]
    except (ValueError, KeyError, TypeError):
        return -1
    return amount if isinstance(amount, int) else -1


def _bad_amount() -> JsonResponse:
    return JsonResponse({"error": "amount must be a positive integer (cents)"}, status=400)


# A JSON API for programs (no cookies, so no CSRF to protect against).
@csrf_exempt
@require_POST
def pay(request: HttpRequest, order_id: int) -> HttpResponse:
    amount = _amount(request)
    if amount <= 0:
        return _bad_amount()
    with rlock(f"order:{order_id}", timeout=10) as lock:
        # Read, charge and write under the lock: no other request or task
        # changes this order in between.
        order = get_object_or_404(Order, pk=order_id)
        entry = order.pay(amount, lock=lock, source="web")
    return JsonResponse(entry.as_json())


@csrf_exempt
@require_POST
@locked("order:{order_id}", timeout=0)  # busy: 409 Conflict + Retry-After
def refund(request: HttpRequest, order_id: int) -> HttpResponse:
    amount = _amount(request)
    if amount <= 0:
        return _bad_amount()
    order = get_object_or_404(Order, pk=order_id)
    # Re-entering the lock that @locked holds: a reentrant lock lets us.
    with rlock(f"order:{order_id}") as lock:
        entry = order.refund(amount, lock=lock, source="web")
    return JsonResponse(entry.as_json())


@require_GET
def order_detail(request: HttpRequest, order_id: int) -> HttpResponse:
    order = get_object_or_404(Order, pk=order_id)
    return JsonResponse(
        {"order": order.pk, "total": order.total, "balance": order.balance, "fence": order.fence}
    )


@csrf_exempt
@require_POST
def start_report(request: HttpRequest, customer_id: int) -> HttpResponse:
    customer = get_object_or_404(Customer, pk=customer_id)
    try:
        seconds = float(json.loads(request.body or b"{}").get("seconds", 60.0))
    except (ValueError, TypeError, AttributeError):
        return JsonResponse({"error": "seconds must be a number"}, status=400)
    result = build_report.delay(customer.pk, seconds=seconds)
    return JsonResponse({"task": result.id}, status=202)
