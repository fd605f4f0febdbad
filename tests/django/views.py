"""Views the decorator tests call through Django's test clients."""

from __future__ import annotations

import asyncio
import threading

from django.http import HttpRequest, HttpResponse
from django.utils.decorators import method_decorator
from django.views import View

from django_rlock import locked

#: Set by a test to let the view that holds the lock return.
release_holder = threading.Event()
#: Set by the holding view once it holds the lock.
holder_inside = threading.Event()
async_release_holder: asyncio.Event | None = None


@locked("order:{order_id}", timeout=0, lease=7)
def pay(request: HttpRequest, order_id: int) -> HttpResponse:
    holder_inside.set()
    release_holder.wait(30)
    return HttpResponse(f"paid {order_id}")


@locked("order:{order_id}", timeout=0)
def quick(request: HttpRequest, order_id: int) -> HttpResponse:
    return HttpResponse("ok")


@locked("order:{order_id}", timeout=0, busy_response=423)
def quick_423(request: HttpRequest, order_id: int) -> HttpResponse:
    return HttpResponse("ok")


@locked("order:{order_id}", timeout=0, busy_response="raise")
def quick_raise(request: HttpRequest, order_id: int) -> HttpResponse:
    return HttpResponse("ok")


def _teapot(request: HttpRequest, error: Exception) -> HttpResponse:
    return HttpResponse("busy", status=418)


@locked("order:{order_id}", timeout=0, busy_response=_teapot)
def quick_callable(request: HttpRequest, order_id: int) -> HttpResponse:
    return HttpResponse("ok")


@locked("order:{order_id}", timeout=0)
async def async_pay(request: HttpRequest, order_id: int) -> HttpResponse:
    if async_release_holder is not None:
        holder_inside.set()
        await async_release_holder.wait()
    return HttpResponse(f"async paid {order_id}")


@method_decorator(locked("order:{order_id}", timeout=0), name="get")
class PayView(View):
    def get(self, request: HttpRequest, order_id: int) -> HttpResponse:
        return HttpResponse(f"cbv paid {order_id}")


@method_decorator(locked("{request.method}:{order_id}", timeout=0), name="dispatch")
class DispatchView(View):
    def get(self, request: HttpRequest, order_id: int) -> HttpResponse:
        return HttpResponse("dispatched")
