"""Deadlocks in the Django face: RLOCK_DEADLOCK_TIMEOUT, the lock_deadlock signal, the log."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock import DeadlockError, locks, rlock
from django_rlock.backends.redis import RedisLockBackend
from django_rlock.core import LockClient
from django_rlock.exceptions import LockSettingError
from django_rlock.signals import lock_deadlock
from tests.django.conftest import HANG, Heard


def client_of(alias: str) -> LockClient:
    backend = locks[alias]
    assert isinstance(backend, RedisLockBackend)
    return backend.client


def opposite_order(using: str = "default") -> list[str]:
    """Two threads lock ``a`` and ``b`` in opposite order; their outcomes."""
    both_hold = threading.Barrier(2)
    outcomes: list[str] = []

    def member(first: str, second: str) -> None:
        with rlock(first, using=using):
            both_hold.wait(HANG)
            try:
                with rlock(second, using=using):
                    outcomes.append("granted")
            except DeadlockError:
                outcomes.append("deadlock")

    threads = [
        threading.Thread(target=member, args=("a", "b")),
        threading.Thread(target=member, args=("b", "a")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HANG)
        assert not thread.is_alive()
    return sorted(outcomes)


@pytest.mark.parametrize("alias", ["default", "mem"])
def test_a_deadlock_is_broken_signalled_and_logged(
    settings: SettingsWrapper, caplog: pytest.LogCaptureFixture, alias: str
) -> None:
    settings.RLOCK_DEADLOCK_TIMEOUT = 0.3
    heard = Heard()
    lock_deadlock.connect(heard, weak=False)
    try:
        with caplog.at_level(logging.WARNING, logger="django_rlock.lock"):
            assert opposite_order(alias) == ["deadlock", "granted"]
    finally:
        lock_deadlock.disconnect(heard)
    assert len(heard.calls) == 1
    call: dict[str, Any] = heard.calls[0]
    assert call["alias"] == alias
    assert call["name"] in ("a", "b")
    assert isinstance(call["error"], DeadlockError)
    assert [entry["lock"] for entry in call["cycle"]] == [
        call["name"],
        "b" if call["name"] == "a" else "a",
    ]
    assert call["waited"] > 0.3
    logged = [record.getMessage() for record in caplog.records if "deadlock" in record.getMessage()]
    assert len(logged) == 1
    assert logged[0].startswith("deadlock detected") and f"(alias {alias!r})" in logged[0]


def test_the_setting_reaches_the_client_per_alias_or_globally(
    settings: SettingsWrapper, rlocks: dict[str, Any]
) -> None:
    assert client_of("default").deadlock_timeout == 1.0  # the default, PostgreSQL's
    locks.close_all()
    settings.RLOCK_DEADLOCK_TIMEOUT = None
    assert client_of("default").deadlock_timeout is None
    locks.close_all()
    settings.RLOCKS = {**rlocks, "default": {**rlocks["default"], "DEADLOCK_TIMEOUT": 0.25}}
    assert client_of("default").deadlock_timeout == 0.25


@pytest.mark.parametrize("value", [0, -1, "1", True, float("nan")])
def test_a_bad_setting_is_refused_naming_it(settings: SettingsWrapper, value: object) -> None:
    settings.RLOCK_DEADLOCK_TIMEOUT = value
    with pytest.raises(LockSettingError, match=r"RLOCK_DEADLOCK_TIMEOUT.*deadlock_timeout"):
        locks["default"].lock("x")
