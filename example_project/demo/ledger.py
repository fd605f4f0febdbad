"""After the run: the database checked, every order's ledger and every customer's reports.

Each recorded critical section carries its fencing token and when it ran
(:class:`demo.checks.Section`); :func:`demo.checks.violations` finds overlaps.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from django.db.models import Sum
from django.utils import timezone

from demo.checks import Section, balance_errors, violations
from demo.monitor import report_lock
from demo.outcomes import Kill, Ledger, Shop
from orders.models import Entry, Order, Report


def check_ledger(shop: Shop, kill: Kill) -> Ledger:
    """Overlapping sections under each order's and report's lock, and wrong balances."""
    found: list[str] = []
    inconsistent: list[str] = []
    orders = 0
    for order in Order.objects.all():
        entries = Entry.objects.filter(order=order)
        sections = [
            Section(e.fence, e.held_from, e.held_until, e.balance_before, e.balance_after)
            for e in entries
        ]
        found += [f"order {order.pk}: {text}" for text in violations(sections, order.total)]
        sums = {
            kind: entries.filter(kind=kind).aggregate(s=Sum("amount"))["s"] or 0
            for kind in (Entry.PAYMENT, Entry.REFUND)
        }
        errors = balance_errors(order.total, order.balance, sums[Entry.PAYMENT], sums[Entry.REFUND])
        inconsistent += [f"order {order.pk}: {text}" for text in errors]
        orders += 1
    for customer in shop.customers:
        # The SIGKILLed run never finished: it held its lock until the kill.
        killed_end = killed_run_end(kill)
        report_sections = [
            Section(r.fence, r.started_at, r.finished_at or killed_end)
            for r in Report.objects.filter(customer_id=customer)
        ]
        found += [f"{report_lock(customer)}: {text}" for text in violations(report_sections)]
    return Ledger(orders=orders, violations=tuple(found), inconsistent_orders=tuple(inconsistent))


def killed_run_end(kill: Kill) -> datetime:
    """When the killed run stopped holding its lock, as a database time."""
    if not kill.killed_at:
        return timezone.now()
    ago = time.monotonic() - kill.killed_at
    return timezone.now() - timedelta(seconds=ago)
