"""The Django face's signals, once for every Django backend and both of its paths.

The core engines send no signals: these rules are generated for the Django
engines only (``engines(django=True)``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.dispatch import Signal

from django_rlock.core import LockLostError
from django_rlock.signals import lock_acquired, lock_lost, lock_released
from tests.conformance.conftest import engines
from tests.conformance.drivers import HANG, Driver, Engine

Connect = Callable[..., Driver]


class Received:
    """The lock signals sent during a test, in order, as ``(signal, name, lost)``."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, bool | None]] = []
        self.changed = threading.Condition()

    def receiver(self, which: str) -> Callable[..., None]:
        def receive(sender: object, **kwargs: Any) -> None:
            with self.changed:
                self.sent.append((which, kwargs["name"], kwargs.get("lost")))
                self.changed.notify_all()

        return receive

    def wait_for(self, count: int) -> list[tuple[str, str, bool | None]]:
        """The signals once ``count`` have arrived (lock_lost comes from a thread)."""
        with self.changed:
            self.changed.wait_for(lambda: len(self.sent) >= count, HANG)
            return list(self.sent)


@pytest.fixture
def received() -> Iterator[Received]:
    record = Received()
    signals: list[tuple[Signal, str]] = [
        (lock_acquired, "acquired"),
        (lock_released, "released"),
        (lock_lost, "lost"),
    ]
    receivers = [record.receiver(which) for _, which in signals]
    for (signal, _), receiver in zip(signals, receivers, strict=True):
        signal.connect(receiver, weak=False)
    yield record
    for (signal, _), receiver in zip(signals, receivers, strict=True):
        signal.disconnect(receiver)


@pytest.mark.parametrize("engine", engines(django=True, full_api=False))
def test_one_acquired_and_one_released_per_outermost_hold(
    connect: Connect, engine: Engine, received: Received
) -> None:
    driver = connect(engine)
    (a,) = driver.owners(1)
    lock = driver.lock("sig")
    a.call(lock, "enter")
    a.call(lock, "enter")
    a.call(lock, "exit")
    a.call(lock, "exit")
    assert received.wait_for(2) == [("acquired", "sig", None), ("released", "sig", False)]


@pytest.mark.parametrize("engine", engines(django=True))
def test_a_lost_hold_sends_lost_and_a_lost_release(
    connect: Connect, engine: Engine, received: Received
) -> None:
    driver = connect(engine)
    a, b = driver.owners(2)
    lock = driver.lock("sig")
    assert a.call(lock, "acquire") is True
    assert b.call(lock, "force_release") is True
    with pytest.raises(LockLostError):
        a.call(lock, "release")
    assert sorted(received.wait_for(3)) == [
        ("acquired", "sig", None),
        ("lost", "sig", None),
        ("released", "sig", True),
    ]
