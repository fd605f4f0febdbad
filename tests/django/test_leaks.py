"""Holds that outlive what took them: a thread, an asyncio task, a request; and max_hold.

Each is reported (an ERROR naming the code that took it, the ``lock_leaked``
signal, the metric) and given back (``RLOCK_LEAKED = "release"``, the default),
or only reported and no longer renewed (``"warn"``). Before, each was renewed
by the watchdog for as long as the process lived. The aliases' watchdog
timeout is 5 s here (tests/django/conftest.py): the watchdog ticks every 1.7 s.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis
from django.test import Client
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock import locks, rlock
from django_rlock.exceptions import LockLostError
from django_rlock.signals import lock_lost
from tests.django.conftest import Heard

HANG = 20.0  # seconds: reached only when something hangs


def free_within(name: str, seconds: float) -> float:
    """Seconds until another thread took lock ``name``; fails after ``seconds``."""
    started = time.monotonic()
    took: list[float] = []

    def try_it() -> None:
        lock = locks["default"].lock(name)
        if lock.acquire(timeout=seconds):
            took.append(time.monotonic() - started)
            lock.release()

    thread = threading.Thread(target=try_it)
    thread.start()
    thread.join(seconds + HANG)
    assert took, f"lock {name!r} was still held {seconds}s later"
    return took[0]


def take_in_a_thread_that_ends(name: str) -> None:
    """A thread takes lock ``name`` (watchdog) and ends without releasing it."""
    thread = threading.Thread(target=lambda: locks["default"].lock(name).acquire())
    thread.start()
    thread.join(HANG)


def test_a_thread_that_ends_holding_is_reported_and_released(
    leaked: Heard, caplog: pytest.LogCaptureFixture
) -> None:
    take_in_a_thread_that_ends("orphan")
    assert locks["default"].lock("orphan").locked()
    # The watchdog's next tick (1.7 s) finds the owner gone; a 5 s timeout is a long way off.
    waited = free_within("orphan", 4.0)
    assert waited < 4.0
    assert leaked.arrived.wait(HANG)
    (call,) = leaked.calls
    assert call["name"] == "orphan"
    assert call["alias"] == "default"
    assert call["released"] is True
    assert "thread" in call["reason"]
    assert call["location"] is not None and "test_leaks.py" in call["location"]
    assert any("leaked" in record.getMessage() for record in caplog.records)


def test_warn_reports_a_leak_and_lets_it_expire(
    leaked: Heard, settings: SettingsWrapper, r: redis.Redis
) -> None:
    settings.RLOCKS = {
        **settings.RLOCKS,
        "default": {**settings.RLOCKS["default"], "LEAKED": "warn"},
    }
    take_in_a_thread_that_ends("kept")
    assert leaked.arrived.wait(HANG)
    assert leaked.calls[0]["released"] is False
    # Reported, not given back: still held right after the report...
    assert locks["default"].lock("kept").locked()
    # ...and no longer renewed: it expires within the 5 s watchdog timeout, not later.
    waited = free_within("kept", 7.0)
    assert 0 < waited < 7.0


def test_a_request_that_leaves_a_hold_gives_it_back(leaked: Heard) -> None:
    response = Client().get("/leaky/request-leak/")
    assert response.status_code == 200
    # Given back as the request finished, on its own thread: free at once.
    lock = locks["default"].lock("request-leak")
    assert not lock.locked()
    (call,) = leaked.calls
    assert "request" in call["reason"]
    assert call["location"] is not None and "leak_views.py" in call["location"]


def test_holds_taken_before_the_request_started_are_not_the_requests(leaked: Heard) -> None:
    with rlock("around-the-request"):
        response = Client().get("/leaky/inside/")
        assert response.status_code == 200
        # The test's own hold survives the request's end; the request's is gone.
        assert locks["default"].lock("around-the-request").owned()
        assert not locks["default"].lock("inside").locked()
    assert [call["name"] for call in leaked.calls] == ["inside"]


def test_an_async_view_that_leaves_a_hold_under_wsgi_is_reported_and_expires(
    leaked: Heard,
) -> None:
    # Under WSGI an async view runs in an event loop of its own, closed with the
    # request: the release started as the view's task ends is cancelled with it.
    # The hold is reported and no longer renewed, so it ends within the 5 s timeout.
    response = Client().get("/leaky-async/async-leak/")
    assert response.status_code == 200
    assert [call["name"] for call in leaked.calls] == ["async-leak"]
    assert "task" in leaked.calls[0]["reason"]
    assert free_within("async-leak", 7.0) < 7.0


def test_an_asyncio_task_that_ends_holding_gives_it_back_at_once(leaked: Heard) -> None:
    async def main() -> bool:
        async def leak() -> None:
            await locks["default"].async_lock("task-leak").__aenter__()

        await asyncio.create_task(leak())
        # The task's end runs its release on this loop: let it finish.
        for _ in range(100):
            if not locks["default"].lock("task-leak").locked():
                return True
            await asyncio.sleep(0.01)
        return False

    assert asyncio.run(main())
    assert [call["name"] for call in leaked.calls] == ["task-leak"]


def test_max_hold_stops_renewals_and_declares_the_hold_lost() -> None:
    lost = Heard()
    lock_lost.connect(lost, weak=False)
    try:
        lock = locks["default"].lock("bounded", max_hold=1.0)
        lock.acquire()
        # Past 1 s, the next watchdog tick (every 1.7 s) declares it lost.
        assert lost.arrived.wait(HANG)
        assert lock.lost
        with pytest.raises(LockLostError):
            lock.release()
    finally:
        lock_lost.disconnect(lost)


def test_max_hold_from_the_settings_and_rlock(settings: SettingsWrapper) -> None:
    settings.RLOCK_MAX_HOLD = 1.0
    assert locks["default"].lock("a").max_hold == 1.0
    assert rlock("b", max_hold=2.5).max_hold == 2.5


@pytest.mark.parametrize("value", [0, -1, "soon", True])
def test_a_bad_max_hold_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match="max_hold"):
        locks["default"].lock("x", max_hold=value)  # type: ignore[arg-type]


def test_a_bad_leaked_setting_is_refused(settings: SettingsWrapper) -> None:
    from django_rlock.exceptions import LockSettingError  # noqa: PLC0415

    settings.RLOCK_LEAKED = "ignore"
    with pytest.raises(LockSettingError, match="RLOCK_LEAKED"):
        locks["default"].lock("x")
