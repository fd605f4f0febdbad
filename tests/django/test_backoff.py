"""Honest back-off: a busy view's Retry-After and a busy task's countdown follow how
long the lock is really held, recently, not the holder's whole lease."""

from __future__ import annotations

import pytest
from django.test import Client

from celery_rlock.guard import retry_countdown
from django_rlock.handler import locks
from django_rlock.holdtimes import MIN_SAMPLES, NAMES, HoldTimes
from tests.django.conftest import Holders


def _hold_briefly(name: str, times: int) -> None:
    lock = locks["default"].lock(name)
    lock.key_template = "order:{order_id}"  # as @locked sets it
    for _ in range(times):
        with lock:
            pass


def test_a_busy_view_answers_with_the_recent_holds_not_the_lease(hold_elsewhere: Holders) -> None:
    hold_elsewhere("order:8", lease=20)
    before = Client().get("/quick/8/")
    assert before.status_code == 409
    assert int(before["Retry-After"]) >= 19  # nothing seen yet: the lease left
    _hold_briefly("order:9", MIN_SAMPLES)  # another order, same template: quick holds
    after = Client().get("/quick/8/")
    assert after.status_code == 409
    assert after["Retry-After"] == "1"


class _Task:
    """What retry_countdown reads of a Celery task (its options and request)."""

    def __init__(self, **options: object) -> None:
        self.__dict__.update(options)
        self.request = type("Request", (), {"retries": 3})()


def test_a_busy_tasks_countdown_follows_recent_holds_and_celerys_backoff() -> None:
    lock = locks["default"].lock("order:10")
    lock.key_template = "order:{order_id}"
    assert retry_countdown(_Task(), lock, 20.0) == 20.0  # nothing seen yet
    _hold_briefly("order:11", MIN_SAMPLES)
    assert retry_countdown(_Task(), lock, 20.0) == 1.0
    # Celery's exponential back-off (factor 2, 3rd retry: 16 s, no jitter) wins when longer.
    backing_off = _Task(retry_backoff=2, retry_backoff_max=600, retry_jitter=False)
    assert retry_countdown(backing_off, lock, 20.0) == 16.0
    capped = _Task(retry_backoff=2, retry_backoff_max=5, retry_jitter=False)
    assert retry_countdown(capped, lock, 20.0) == 5.0


def test_hold_times_are_bounded_by_the_lease_and_a_second() -> None:
    times = HoldTimes()
    for held in (4.0, 5.0, 6.0):
        times.observe("report:1", "report:{id}", held)
    assert times.retry_after("report:1", None, 30.0) == 5.0  # the median
    assert times.retry_after("report:1", None, 2.5) == 2.5  # the lock is free by then
    assert times.retry_after("report:2", "report:{id}", 30.0) == 5.0  # by its template
    assert times.retry_after("report:2", None, 30.0) == 30.0  # nothing known: the lease
    assert times.retry_after("report:2", None, None) == 1.0
    times.observe("quick", None, 0.01)
    assert times.retry_after("quick", None, 30.0) == 30.0  # one hold says nothing yet


@pytest.mark.parametrize("extra", [1, 10])
def test_hold_times_forget_the_least_recent_names(extra: int) -> None:
    times = HoldTimes()
    for _ in range(MIN_SAMPLES):
        times.observe("first", None, 2.0)
    for index in range(NAMES - 1 + extra):
        times.observe(f"name:{index}", None, 1.0)
    assert times.typical("first", None) is None
