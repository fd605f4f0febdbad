"""The slow-lock log on logger django_rlock.slow, and the lost signal under the watchdog."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock import locked, locks, rlock
from tests.django.conftest import Holders


@pytest.mark.parametrize("alias", ["default", "mem"])
def test_slow_waits_and_holds_are_logged_with_the_location(
    settings: SettingsWrapper, caplog: pytest.LogCaptureFixture, alias: str
) -> None:
    settings.RLOCK_SLOW_WAIT = 0
    settings.RLOCK_SLOW_HOLD = 0
    with caplog.at_level(logging.WARNING, logger="django_rlock.slow"), rlock("slow", using=alias):
        pass
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2
    wait, hold = messages
    assert wait.startswith(f"slow lock wait: 'slow' (alias {alias!r}) waited ")
    assert hold.startswith(f"slow lock hold: 'slow' (alias {alias!r}) held ")
    assert all(f"{__file__}:" in message for message in messages)
    assert all(record.name == "django_rlock.slow" for record in caplog.records)


def test_thresholds_are_respected_and_off_by_default(
    settings: SettingsWrapper, caplog: pytest.LogCaptureFixture, rlocks: dict[str, Any]
) -> None:
    with caplog.at_level(logging.WARNING, logger="django_rlock.slow"):
        with rlock("quiet"):
            pass
        settings.RLOCKS = {**rlocks, "default": {**rlocks["default"], "SLOW_HOLD": 60}}
        with rlock("quiet"):
            pass
    assert caplog.records == []


def test_a_timed_out_wait_is_logged_and_decorators_name_the_function(
    settings: SettingsWrapper, caplog: pytest.LogCaptureFixture, hold_elsewhere: Holders
) -> None:
    settings.RLOCK_SLOW_WAIT = 0.01

    @locked("busy", timeout=0.05)
    def job() -> None: ...

    hold_elsewhere("busy")
    caplog.clear()  # the holder's own acquire may pass 0.01 s on a loaded machine
    with caplog.at_level(logging.WARNING, logger="django_rlock.slow"), pytest.raises(TimeoutError):
        job()
    (record,) = caplog.records
    assert "and timed out" in record.getMessage()
    assert "in test_a_timed_out_wait_is_logged_and_decorators_name_the_function.<locals>.job" in (
        record.getMessage()
    )


def test_lock_lost_signal_fires_when_the_watchdog_finds_the_key_gone(
    settings: SettingsWrapper, rlocks: dict[str, Any]
) -> None:
    from django_rlock.signals import lock_lost  # noqa: PLC0415

    settings.RLOCKS = {"default": {**rlocks["default"], "WATCHDOG_TIMEOUT": 0.6}}
    lost = threading.Event()
    received: list[dict[str, Any]] = []

    def on_lost(**kwargs: Any) -> None:
        received.append(kwargs)
        lost.set()

    lock_lost.connect(on_lost)
    try:
        lock = locks["default"].lock("watched")
        lock.acquire()
        lock.client.redis.delete(lock.keys.hash)  # as an eviction or an operator would
        assert lost.wait(10)
    finally:
        lock_lost.disconnect(on_lost)
    assert received[0]["name"] == "watched" and received[0]["alias"] == "default"
    assert lock.lost
