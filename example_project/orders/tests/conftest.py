"""Fixtures of the shop's tests: orders to work on.

Locks held by someone else come from django-rlock's own test helpers:
``from django_rlock.testing import held_elsewhere``.
"""

from __future__ import annotations

import pytest

from orders.models import Customer, Order


@pytest.fixture
def order(db: None) -> Order:
    customer = Customer.objects.create(name="Ada")
    return Order.objects.create(customer=customer, total=10_000, balance=10_000)
