"""The tasks, run in this process: their locks, and what they do when the lock is busy.

(Real worker processes, a SIGKILLed one included, are exercised by the demo's test.)
"""

from __future__ import annotations

from django_rlock import locks
from django_rlock.core import LockTimeout
from django_rlock.testing import held_elsewhere

from orders.models import Entry, Order, Report
from orders.tasks import build_report, capture_payment


def test_a_report_runs_under_its_customer_lock(order: Order) -> None:
    result = build_report.apply(args=(order.customer_id,), kwargs={"seconds": 0.2})

    value = result.get()
    report = Report.objects.get()
    assert value["fence"] == report.fence > 0
    assert (value["lost"], value["attempts"], report.orders) == (False, 1, 1)
    assert report.finished_at is not None
    assert locks["default"].inspect(f"report:{order.customer_id}") is None  # released


def test_a_report_of_a_busy_customer_never_runs_beside_the_holder(order: Order) -> None:
    with held_elsewhere(f"report:{order.customer_id}"):
        # Eagerly, Celery runs each retry at once, so all of them meet the busy
        # lock and the last fails with LockTimeout (a worker waits for the lease).
        result = build_report.apply(args=(order.customer_id,), kwargs={"seconds": 0})

    assert result.state == "FAILURE"
    assert isinstance(result.result, LockTimeout)
    assert result.result.retry_after is not None
    assert not Report.objects.exists()


def test_capture_shares_the_order_lock_with_the_views(order: Order) -> None:
    with held_elsewhere(Order.lock_name(order.pk)):
        busy = capture_payment.apply(args=(order.pk, 700))
    captured = capture_payment.apply(args=(order.pk, 700)).get()

    assert isinstance(busy.result, LockTimeout)
    assert busy.result.retry_after is not None
    order.refresh_from_db()
    entry = Entry.objects.get(order=order)
    assert (order.balance, entry.source, captured["fence"]) == (9_300, "task", entry.fence)
