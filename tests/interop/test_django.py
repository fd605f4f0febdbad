"""An alias with ``"LAYOUT": "redisson"``: rlock(), @locked and LockedTask share Java's locks."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from django.core.checks import run_checks
from pytest_django.fixtures import Settings as SettingsWrapper

from celery_rlock import LockedTask
from django_rlock import LockSettingError, LockTimeout, locked, locks, rlock
from django_rlock.backends._locks import RedissonAliasLock


@pytest.fixture
def shared_alias(settings: SettingsWrapper, redis_url: str, r: redis.Redis) -> Iterator[None]:
    settings.RLOCKS = {
        "default": {
            "LOCATION": redis_url,
            "LAYOUT": "redisson",
            "KEY_PREFIX": "shop",
            "WATCHDOG_TIMEOUT": 3,
        }
    }
    yield
    locks.close_all()


def test_rlock_holds_the_lock_java_takes(shared_alias: None, redisson: Any) -> None:
    java = redisson().get_lock("order:42")
    with rlock("order:42", timeout=1) as lock:
        assert isinstance(lock, RedissonAliasLock)
        assert java.is_locked() and not java.try_lock_once()
        info = locks["default"].inspect("order:42")
        assert info is not None and info.holder is not None and info.token == lock.token
        assert list(locks["default"].names()) == ["order:42"]
    assert java.try_lock_once()
    with pytest.raises(LockTimeout), rlock("order:42", timeout=0.2):
        pass
    info = locks["default"].inspect("order:42")  # a Java holder, seen from Django
    assert info is not None and sum(info.holders.values()) == 1 and info.holder is None
    java.unlock()


def test_async_with_rlock_holds_the_lock_java_takes(shared_alias: None, redisson: Any) -> None:
    java = redisson().get_lock("order:50")

    async def main() -> bool:
        async with rlock("order:50", timeout=1):
            return await asyncio.to_thread(lambda: java.is_locked() and not java.try_lock_once())

    assert asyncio.run(main())
    assert java.try_lock_once()
    java.unlock()


def test_locked_functions_hold_the_lock_java_takes(shared_alias: None, redisson: Any) -> None:
    java = redisson().get_lock("refund:7")

    @locked("refund:{order_id}", timeout=1)
    def refund(order_id: int) -> bool:
        return bool(java.is_locked() and not java.try_lock_once())

    assert refund(7)
    assert java.try_lock_once()
    java.unlock()


def test_a_locked_task_holds_the_lock_java_takes(shared_alias: None, redisson: Any) -> None:
    java = redisson().get_lock("report:3")
    app = Celery("interop", set_as_current=False)
    seen: list[bool] = []

    @app.task(base=LockedTask, lock="report:{customer_id}", lock_timeout=1, shared=False)  # type: ignore[untyped-decorator]
    def build_report(customer_id: int) -> None:
        seen.append(java.is_locked() and not java.try_lock_once())

    build_report(3)
    assert seen == [True]
    assert not java.is_locked()


def test_what_the_layout_does_not_offer_is_refused(
    shared_alias: None, settings: SettingsWrapper, redis_url: str
) -> None:
    with pytest.raises(
        ValueError, match="fair_lock\\('x'\\) is not offered with layout='redisson'"
    ):
        locks["default"].fair_lock("x")

    @locked("n:{i}", permits=2)
    def limited(i: int) -> None: ...

    with pytest.raises(ValueError, match="semaphore\\('n:1'\\) is not offered"):
        limited(1)
    settings.RLOCKS = {"default": {"LOCATION": redis_url, "LAYOUT": "java"}}
    with pytest.raises(LockSettingError, match="LAYOUT'\\] must be one of 'rlock', 'redisson'"):
        locks["default"]
    assert [message.id for message in run_checks(tags=["django_rlock"])] == ["django_rlock.E010"]
    settings.RLOCKS = {"default": {"LOCATION": redis_url, "LAYOUT": "redisson", "MIN_REPLICAS": 1}}
    with pytest.raises(LockSettingError, match="MIN_REPLICAS 1: replica-synced grants"):
        locks["default"]
