"""The shop's Celery tasks, each run under a distributed lock.

``build_report`` uses ``base=LockedTask``: one report per customer at a time,
however long it runs. ``capture_payment`` uses ``@locked`` with the order's
lock, the one the pay and refund views take, and ``on_busy="retry"``: when a
request holds the order, the task goes back to the queue instead of waiting
in a worker process.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import shared_task
from celery_rlock import LockedTask, locked
from django.db.models import Sum
from django.utils import timezone

from orders.models import Entry, Order, Report


@shared_task(
    bind=True,
    base=LockedTask,
    lock="report:{customer_id}",
    max_retries=30,
    # If the worker process dies mid-run, put the task back in the queue: its
    # next run retries until the dead run's lock expires, then builds the report.
    acks_late=True,
    reject_on_worker_lost=True,
)
def build_report(self: LockedTask, customer_id: int, seconds: float = 60.0) -> dict[str, Any]:
    """Build a customer's statement: slow work, one run per customer at a time.

    The run holds ``report:<customer_id>`` for as long as it lasts, many times
    ``RLOCK_WATCHDOG_TIMEOUT``: this process's watchdog renews the lock every
    third of the timeout. ``seconds`` stands for the work a real report does.
    """
    held = self.request.rlock
    report = Report.objects.create(
        customer_id=customer_id,
        task_id=self.request.id,
        fence=held.token,
        worker_pid=os.getpid(),
    )
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.25))  # a real report would crunch numbers here
    orders = Order.objects.filter(customer_id=customer_id)
    paid = Entry.objects.filter(order__in=orders, kind=Entry.PAYMENT).aggregate(s=Sum("amount"))
    report.orders = orders.count()
    report.paid = paid["s"] or 0
    report.lost = held.lock.lost
    report.finished_at = timezone.now()
    report.save()
    return {
        "customer": customer_id,
        "report": report.pk,
        "held": round(held.held, 3),
        "fence": held.token,
        "lost": report.lost,
        "attempts": self.request.retries + 1,
    }


@shared_task(bind=True, max_retries=30)
@locked("order:{order_id}", on_busy="retry")
def capture_payment(self: Any, order_id: int, amount: int) -> dict[str, Any]:
    """Charge an order in the background, under the lock the views take."""
    order = Order.objects.get(pk=order_id)
    entry = order.pay(amount, lock=self.request.rlock.lock, source="task")
    return {**entry.as_json(), "attempts": self.request.retries + 1}
