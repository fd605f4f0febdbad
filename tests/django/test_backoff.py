"""Honest back-off: a busy view's Retry-After and a busy task's countdown follow how
long the lock is really held (recent holds, else how long its holder has held it so
far), never the holder's whole lease, from the first request on."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis
from django.test import Client
from pytest_django.fixtures import Settings as SettingsWrapper

from celery_rlock._guard import retry_countdown
from django_rlock._handler import locks
from django_rlock._observers.holdtimes import MIN_SAMPLES, NAMES, HoldTimes
from django_rlock._observers.retryafter import holder_held_for, lock_retry_after, retry_after
from django_rlock.core import LockClient
from django_rlock.core._process.holder import SINCE_FIELD
from django_rlock.core._protocol.names import LockKeys
from tests.django.conftest import Holders
from tests.servers import free_port

#: The test settings' KEY_PREFIX of every alias (tests/django/conftest.py).
PREFIX = "t"


def _hold_briefly(name: str, times: int) -> None:
    lock = locks["default"].lock(name)
    lock.key_template = "order:{order_id}"  # as @locked sets it
    for _ in range(times):
        with lock:
            pass


def _held_since(r: redis.Redis, name: str, seconds_ago: float) -> float:
    """Make lock ``name``'s grant ``seconds_ago`` old (its acquired_at); when that was set.

    Stands for a holder that has held the lock that long, without sleeping: the
    grant's time is the one field the back-off reads of it.
    """
    now_seconds, now_micros = r.time()
    since_ms = now_seconds * 1000 + now_micros // 1000 - int(seconds_ago * 1000)
    assert r.hset(LockKeys.build(PREFIX, name).hash, SINCE_FIELD, str(since_ms)) == 0
    return time.time()


def test_a_lock_just_taken_elsewhere_asks_for_one_second_not_its_lease(
    hold_elsewhere: Holders,
) -> None:
    hold_elsewhere("order:1", lease=30)
    assert retry_after(locks["default"], "order:1", "order:{order_id}", 29.9) == 1.0


def test_a_lock_held_three_seconds_asks_for_about_three(
    hold_elsewhere: Holders, r: redis.Redis
) -> None:
    hold_elsewhere("order:2", lease=30)
    set_at = _held_since(r, "order:2", 3.0)
    seconds = retry_after(locks["default"], "order:2", None, 29.0)
    # 3 s, plus what passed since the grant's time was set (and 50 ms of clock reading).
    assert 3.0 <= seconds <= 3.05 + (time.time() - set_at)


def test_the_holders_time_is_bounded_by_the_lease_left(
    hold_elsewhere: Holders, r: redis.Redis
) -> None:
    hold_elsewhere("order:3", lease=30)
    _held_since(r, "order:3", 600.0)
    left = locks["default"].lock("order:3").ttl()
    assert left is not None
    assert retry_after(locks["default"], "order:3", None, left) == left


def test_recent_holds_come_before_the_holders_time(hold_elsewhere: Holders, r: redis.Redis) -> None:
    hold_elsewhere("order:4", lease=30)
    _held_since(r, "order:4", 10.0)
    _hold_briefly("order:5", MIN_SAMPLES)  # same template: quick holds
    assert retry_after(locks["default"], "order:4", "order:{order_id}", 29.0) == 1.0
    assert retry_after(locks["default"], "order:4", None, 29.0) >= 10.0  # no history by name


def test_a_lock_released_meanwhile_asks_for_one_second(r: redis.Redis) -> None:
    assert holder_held_for(locks["default"], "order:6") == 0.0
    assert retry_after(locks["default"], "order:6", None, 25.0) == 1.0


def test_an_unreadable_holder_falls_back_to_the_lease_left(
    settings: SettingsWrapper, rlocks: dict[str, Any]
) -> None:
    settings.RLOCKS = {**rlocks, "default": {"LOCATION": f"redis://127.0.0.1:{free_port()}/0"}}
    assert holder_held_for(locks["default"], "order:7") is None  # never raises
    assert retry_after(locks["default"], "order:7", None, 25.0) == 25.0


def test_a_semaphores_holders_are_not_read(hold_elsewhere: Holders) -> None:
    # Its permits are not in the lock hash inspect() reads: "nobody holds it" would lie.
    hold_elsewhere("partner:1", lease=30)  # the plain lock of the same name is held...
    semaphore = locks["default"].semaphore("partner:1", 2)
    assert lock_retry_after(semaphore, 25.0) == 25.0  # ...and is not the semaphore's holder
    assert lock_retry_after(locks["default"].lock("partner:1"), 25.0) == 1.0


def test_the_rule_also_holds_on_the_locmem_alias(hold_elsewhere: Holders) -> None:
    hold_elsewhere("order:8", using="mem", lease=30)
    assert lock_retry_after(locks["mem"].lock("order:8"), 29.0) == 1.0


def test_a_busy_locked_view_answers_with_the_holders_time(hold_elsewhere: Holders) -> None:
    hold_elsewhere("order:9", lease=20)
    before = Client().get("/quick/9/")
    assert before.status_code == 409
    assert before["Retry-After"] == "1"  # nothing seen yet, held for well under a second


def test_a_busy_locked_view_answers_with_the_recent_holds(hold_elsewhere: Holders) -> None:
    hold_elsewhere("order:10", lease=20)
    _hold_briefly("order:11", MIN_SAMPLES)  # another order, same template: quick holds
    after = Client().get("/quick/10/")
    assert after.status_code == 409
    assert after["Retry-After"] == "1"


class _Task:
    """What retry_countdown reads of a Celery task (its options and request)."""

    def __init__(self, **options: object) -> None:
        self.__dict__.update(options)
        self.request = type("Request", (), {"retries": 3})()


def test_a_busy_tasks_countdown_follows_the_holder_then_recent_holds(
    hold_elsewhere: Holders, r: redis.Redis
) -> None:
    hold_elsewhere("order:12", lease=30)
    lock = locks["default"].lock("order:12")
    lock.key_template = "order:{order_id}"
    assert retry_countdown(_Task(), lock, 20.0) == 1.0  # nothing seen: held just now
    _held_since(r, "order:12", 600.0)
    assert retry_countdown(_Task(), lock, 20.0) == 20.0  # held long: the lease left
    _hold_briefly("order:13", MIN_SAMPLES)
    assert retry_countdown(_Task(), lock, 20.0) == 1.0  # recent holds come first
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
    assert times.retry_after("report:1", None, 30.0, held_for=20.0) == 5.0  # history first
    assert times.retry_after("report:2", "report:{id}", 30.0) == 5.0  # by its template
    assert times.retry_after("report:2", None, 30.0, held_for=0.2) == 1.0  # the holder's time
    assert times.retry_after("report:2", None, 30.0, held_for=7.5) == 7.5
    assert times.retry_after("report:2", None, 3.0, held_for=7.5) == 3.0  # never past the lease
    assert times.retry_after("report:2", None, None, held_for=7.5) == 7.5
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


def test_a_lock_of_no_alias_asks_for_its_holders_age(redis_url: str, r: redis.Redis) -> None:
    # Celery without Django locks through a bare LockClient: no hold history,
    # but the holder's age still beats its 30 s lease.
    with LockClient(redis_url, key_prefix="t") as client:
        holder = threading.Thread(target=lambda: client.lock("bare:1").acquire(lease=30))
        holder.start()
        holder.join(10)
        set_at = _held_since(r, "bare:1", 3.0)
        seconds = lock_retry_after(client.lock("bare:1"), 29.0)
        assert seconds is not None
        assert 3.0 <= seconds <= 3.05 + (time.time() - set_at)
        assert lock_retry_after(client.lock("bare:free"), 29.0) == 1.0  # free by now
