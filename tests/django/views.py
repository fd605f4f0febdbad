"""Views the decorator tests call through Django's test clients."""

from __future__ import annotations

import asyncio
import threading

from asgiref.sync import sync_to_async
from django.db import connections, transaction
from django.http import HttpRequest, HttpResponse
from django.utils.decorators import method_decorator
from django.views import View

from django_rlock import locked, rlock

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


# -- Accounts (tests/django/test_transactions.py) -------------------------------
# A table made with raw SQL by the tests (the suite has no models of its own), on
# the database alias named in the URL. A withdrawal reads the balance and writes
# it back less 1: two of them overlapping lose one.

#: The accounts table, one row per account: ``id``, ``balance``.
ACCOUNTS = "rlock_account"


def take_one(db: str, account_id: int) -> int:
    """Read ``account_id``'s balance, write it back less 1; the new balance."""
    with connections[db].cursor() as cursor:
        cursor.execute(f"SELECT balance FROM {ACCOUNTS} WHERE id = %s", [account_id])
        row = cursor.fetchone()
        assert row is not None, f"no account {account_id} on {db}"
        balance = int(row[0]) - 1
        cursor.execute(f"UPDATE {ACCOUNTS} SET balance = %s WHERE id = %s", [balance, account_id])
    return balance


@locked("account:{db}:{account_id}")
def withdraw(request: HttpRequest, db: str, account_id: int) -> HttpResponse:
    """The issue's view: under ``ATOMIC_REQUESTS`` its transaction commits after it returns."""
    return HttpResponse(str(take_one(db, account_id)))


def _withdraw_in_a_transaction(db: str, account_id: int) -> int:
    try:
        with transaction.atomic(using=db):
            return take_one(db, account_id)
    finally:
        # Runs on an executor thread of its own: leave no connection behind it.
        connections[db].close()


async def withdraw_async(request: HttpRequest, db: str, account_id: int) -> HttpResponse:
    """Async: Django has no async atomic, so the transaction ends inside the lock's block."""
    async with rlock(f"account:{db}:{account_id}"):
        work = sync_to_async(_withdraw_in_a_transaction, thread_sensitive=False)
        balance = await work(db, account_id)
    return HttpResponse(str(balance))
