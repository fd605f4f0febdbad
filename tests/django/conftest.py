"""Django-side fixtures: RLOCKS pointed at the test redis-server, fresh per test."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import pytest
import redis
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock._handler import locks
from django_rlock.backends.locmem import LocMemLockBackend
from django_rlock.signals import lock_leaked

LOCMEM = "django_rlock.backends.locmem.LocMemLockBackend"
HANG = 10.0  # seconds: only ever reached when something hangs


@pytest.fixture(autouse=True)
def rlocks(settings: SettingsWrapper, redis_url: str, r: redis.Redis) -> Iterator[dict[str, Any]]:
    """RLOCKS for every Django test: ``default`` on the test Redis, ``mem`` LocMem (emptied)."""
    settings.RLOCKS = {
        "default": {"LOCATION": redis_url, "KEY_PREFIX": "t", "WATCHDOG_TIMEOUT": 5},
        "mem": {"BACKEND": LOCMEM, "KEY_PREFIX": "t", "WATCHDOG_TIMEOUT": 5},
    }
    # The store (this process's private server) outlives its aliases: empty it,
    # through a backend of its own (the handler builds ``mem`` only when used).
    emptier = LocMemLockBackend("mem", settings.RLOCKS["mem"])
    emptier.client.redis.flushall()
    emptier.close()
    yield settings.RLOCKS
    locks.close_all()


class HoldingThreads:
    """Holds kept by live threads of their own until the test ends (a thread that ended
    could pass its identity on to a new thread, so holders stay alive until then)."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def keep(self, hold: Callable[[], AbstractContextManager[object]], what: str) -> None:
        """Enter ``hold()`` on a new thread and stay inside it until the test ends."""
        held = threading.Event()

        def keep_holding() -> None:
            with hold():
                held.set()
                self.stop.wait(HANG)

        thread = threading.Thread(target=keep_holding, daemon=True)
        thread.start()
        assert held.wait(HANG), f"could not take {what}"
        self.threads.append(thread)

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(HANG)


class Holders(HoldingThreads):
    """Locks held by live threads of their own (see :class:`HoldingThreads`)."""

    def __call__(self, name: str, *, using: str = "default", lease: float | None = 20) -> None:
        """Hold lock ``name`` of alias ``using`` on another thread until the test ends."""

        def hold() -> AbstractContextManager[object]:
            # Never released: its lease, or the next test's emptied store, ends it.
            locks[using].lock(name).acquire(lease=lease)
            return nullcontext()

        self.keep(hold, repr(name))


@pytest.fixture
def hold_elsewhere() -> Iterator[Holders]:
    """``hold_elsewhere(name)``: lock ``name`` as another owner for the rest of the test."""
    holders = Holders()
    yield holders
    holders.close()


class Heard:
    """The ``lock_leaked`` (or ``lock_lost``) signals sent while a test runs."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.arrived = threading.Event()

    def __call__(self, **kwargs: Any) -> None:
        self.calls.append(kwargs)
        self.arrived.set()


@pytest.fixture
def leaked() -> Iterator[Heard]:
    """The ``lock_leaked`` signals sent while the test runs."""
    heard = Heard()
    lock_leaked.connect(heard, weak=False)
    yield heard
    lock_leaked.disconnect(heard)
