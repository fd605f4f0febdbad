"""A holder paused past its lease: its late write is refused by the order's fence."""

from __future__ import annotations

import threading

import pytest
from django_rlock import rlock
from django_rlock.core import LockLostError

from orders.models import Entry, Order, StaleFenceError


@pytest.mark.django_db(transaction=True)
def test_a_holder_paused_past_its_lease_cannot_overwrite_the_next_holder(order: Order) -> None:
    name = Order.lock_name(order.pk)
    stale = rlock(name)
    assert stale.acquire(timeout=5, lease=0.3)
    read_under_lock = Order.objects.get(pk=order.pk)

    def next_holder() -> None:
        with rlock(name, timeout=5) as lock:
            Order.objects.get(pk=order.pk).pay(1_000, lock=lock, source="web")

    thread = threading.Thread(target=next_holder)
    thread.start()
    thread.join(10)  # it waits for the paused holder's lease to run out

    with pytest.raises(StaleFenceError):
        read_under_lock.pay(5_000, lock=stale, source="web")
    with pytest.raises(LockLostError):
        stale.release()
    order.refresh_from_db()
    assert order.balance == 9_000
    assert [entry.amount for entry in Entry.objects.filter(order=order)] == [1_000]


def test_changing_an_order_needs_its_lock(order: Order) -> None:
    with rlock("order:somewhere-else") as other, pytest.raises(ValueError, match="holding"):
        order.pay(100, lock=other, source="web")
    with pytest.raises(ValueError, match="holding"):
        order.pay(100, lock=rlock(Order.lock_name(order.pk)), source="web")  # not acquired
