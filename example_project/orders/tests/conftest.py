"""Fixtures of the shop's tests: orders to work on, and locks held by someone else."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import pytest
from django_rlock import locks, rlock

from orders.models import Customer, Order

#: Seconds after which a helper thread gives up: reached only when something hangs.
HANG = 20.0


@pytest.fixture
def order(db: None) -> Order:
    customer = Customer.objects.create(name="Ada")
    return Order.objects.create(customer=customer, total=10_000, balance=10_000)


@contextmanager
def _held_elsewhere(name: str, lease: float | None = None) -> Iterator[None]:
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        lock = rlock(name)
        lock.acquire(timeout=HANG, lease=lease)
        held.set()
        done.wait(HANG)
        if lease is None:
            lock.release()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert held.wait(HANG), f"could not take {name!r}"
    try:
        yield
    finally:
        done.set()
        thread.join(HANG)


@pytest.fixture
def held_elsewhere() -> Iterator[Callable[..., AbstractContextManager[None]]]:
    """``with held_elsewhere("order:1"):`` the lock is held by another thread (owner)."""
    yield _held_elsewhere
    locks.close_all()
