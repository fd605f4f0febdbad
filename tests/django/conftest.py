"""Django-side fixtures: RLOCKS pointed at the test redis-server, fresh per test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock.backends import locmem
from django_rlock.handler import locks

LOCMEM = "django_rlock.backends.locmem.LocMemLockBackend"


@pytest.fixture(autouse=True)
def rlocks(settings: SettingsWrapper, redis_url: str, r: redis.Redis) -> Iterator[dict[str, Any]]:
    """RLOCKS for every Django test: ``default`` on the test Redis, ``mem`` in memory."""
    locmem._stores.clear()
    settings.RLOCKS = {
        "default": {"LOCATION": redis_url, "KEY_PREFIX": "t", "WATCHDOG_TIMEOUT": 5},
        "mem": {"BACKEND": LOCMEM, "KEY_PREFIX": "t", "WATCHDOG_TIMEOUT": 5},
    }
    yield settings.RLOCKS
    locks.close_all()
