"""Customers, their orders, the ledger of every change to an order, and reports.

Every change to an order's balance happens under the order's lock
(``order:<id>``) and is written with the lock's fencing token: the order row
keeps the highest token that wrote it and refuses a write carrying a lower one,
so a holder that lost its lock (paused past its lease) cannot overwrite the
work of the holder that came after it.
"""

from __future__ import annotations

from typing import Any

from django.db import models, transaction
from django.utils import timezone
from django_rlock.core import RLock

from orders import provider


class StaleFenceError(Exception):
    """A write carried a fencing token lower than one the order has already seen."""


class Customer(models.Model):
    name = models.CharField(max_length=100)

    def __str__(self) -> str:
        return str(self.name)


class Order(models.Model):
    customer = models.ForeignKey(Customer, on_delete=models.CASCADE, related_name="orders")
    customer_id: int
    total = models.PositiveIntegerField(help_text="cents")
    balance = models.PositiveIntegerField(help_text="cents still due")
    fence = models.PositiveBigIntegerField(
        default=0, help_text="the highest fencing token that changed this order"
    )

    def __str__(self) -> str:
        return f"order {self.pk}"

    @staticmethod
    def lock_name(order_id: int) -> str:
        """The name of the lock every change to the order holds."""
        return f"order:{order_id}"

    def pay(self, amount: int, *, lock: RLock, source: str) -> Entry:
        """Charge up to ``amount`` cents of the balance through the payment provider.

        Call it holding the order's ``lock``, on the order read under it: the
        charge is computed from the balance read, so two unlocked calls could
        both charge it.
        """
        held_from = timezone.now()
        due = min(amount, self.balance)
        if due:
            provider.charge(self.pk, due)
        return self._record(Entry.PAYMENT, due, lock=lock, source=source, held_from=held_from)

    def refund(self, amount: int, *, lock: RLock, source: str) -> Entry:
        """Give back up to ``amount`` cents of what was paid (same rules as :meth:`pay`)."""
        held_from = timezone.now()
        refundable = min(amount, self.total - self.balance)
        if refundable:
            provider.refund(self.pk, refundable)
        return self._record(Entry.REFUND, refundable, lock=lock, source=source, held_from=held_from)

    def _record(self, kind: str, amount: int, *, lock: RLock, source: str, held_from: Any) -> Entry:
        fence = lock.token
        if fence is None or lock.name != self.lock_name(self.pk):
            raise ValueError(f"change {self} holding its lock {self.lock_name(self.pk)!r}")
        before = self.balance
        after = before - amount if kind == Entry.PAYMENT else before + amount
        with transaction.atomic():
            # The fence: refuse the write if a newer holder already wrote.
            written = Order.objects.filter(pk=self.pk, fence__lte=fence).update(
                balance=after, fence=fence
            )
            if not written:
                raise StaleFenceError(
                    f"{self.lock_name(self.pk)}: token {fence} is older than the order's"
                )
            self.balance, self.fence = after, fence
            return Entry.objects.create(
                order=self,
                kind=kind,
                amount=amount,
                balance_before=before,
                balance_after=after,
                fence=fence,
                source=source,
                held_from=held_from,
                held_until=timezone.now(),
            )


class Entry(models.Model):
    """One change to an order's balance, made under the order's lock."""

    PAYMENT = "payment"
    REFUND = "refund"

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="entries")
    order_id: int
    kind = models.CharField(max_length=10, choices=[(PAYMENT, "payment"), (REFUND, "refund")])
    amount = models.PositiveIntegerField(help_text="cents")
    balance_before = models.PositiveIntegerField()
    balance_after = models.PositiveIntegerField()
    fence = models.PositiveBigIntegerField(help_text="fencing token of the lock held")
    source = models.CharField(max_length=10, help_text="web or task")
    held_from = models.DateTimeField()
    held_until = models.DateTimeField()

    class Meta:
        ordering = ["order", "fence"]
        verbose_name_plural = "entries"

    def as_json(self) -> dict[str, Any]:
        return {
            "order": self.order_id,
            "kind": self.kind,
            "amount": self.amount,
            "balance": self.balance_after,
            "fence": self.fence,
        }


class Report(models.Model):
    """One run of the report task (a killed run leaves an unfinished row)."""

    customer = models.ForeignKey(Customer, on_delete=models.CASCADE, related_name="reports")
    task_id = models.CharField(max_length=64)
    fence = models.PositiveBigIntegerField()
    worker_pid = models.PositiveIntegerField()
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True)
    orders = models.PositiveIntegerField(null=True)
    paid = models.BigIntegerField(null=True, help_text="cents paid over all orders")
    lost = models.BooleanField(null=True, help_text="whether the run's lock was lost")
