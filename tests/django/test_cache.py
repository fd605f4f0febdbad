"""django_rlock.cache.RedisCache: cache.lock() with the cache's KEY_PREFIX and VERSION."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from django.core.cache import caches
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock import locks
from django_rlock.cache import RedisCache
from django_rlock.core import RLock
from django_rlock.exceptions import LockSettingError


@pytest.fixture
def redis_caches(settings: SettingsWrapper, redis_url: str) -> None:
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "shop": {
            "BACKEND": "django_rlock.cache.RedisCache",
            "LOCATION": redis_url,
            "KEY_PREFIX": "shop",
            "VERSION": 3,
        },
        "plain": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": redis_url},
    }


@pytest.mark.usefixtures("redis_caches")
def test_cache_lock_honours_key_prefix_and_version(r: redis.Redis) -> None:
    cache = caches["shop"]
    assert isinstance(cache, RedisCache)
    cache.set("greeting", "hi")
    lock = cache.lock("report:1", timeout=0)
    assert isinstance(lock, RLock)
    with lock:
        assert r.exists("shop:3:rlock:{report:1}")
        assert lock.owned() and lock.token is not None and lock.token >= 1
    with cache.lock("report:1", version=4):
        assert r.exists("shop:4:rlock:{report:1}")
    assert cache.get("greeting") == "hi"
    assert not r.exists("shop:3:rlock:{report:1}")


@pytest.mark.usefixtures("redis_caches")
def test_cache_locks_share_one_client_across_cache_objects() -> None:
    import threading  # noqa: PLC0415

    clients: list[Any] = []

    def look() -> None:  # Django builds one cache object per thread
        cache = caches["shop"]
        assert isinstance(cache, RedisCache)
        clients.append(cache.lock("x").client)

    thread = threading.Thread(target=look)
    thread.start()
    thread.join(10)
    look()
    assert clients[0] is clients[1]


@pytest.mark.usefixtures("redis_caches")
def test_an_rlocks_alias_can_use_a_cache(settings: SettingsWrapper, r: redis.Redis) -> None:
    settings.RLOCKS = {
        "default": {"CACHE": "shop"},
        "plain": {"CACHE": "plain", "KEY_PREFIX": "own"},
    }
    with locks["default"].lock("a"):
        assert r.exists("shop:3:rlock:{a}")
        cache = caches["shop"]
        assert isinstance(cache, RedisCache)
        assert cache.lock("a").locked()  # the same lock as cache.lock()
    with locks["plain"].lock("b"):
        assert r.exists("own:{b}")
    assert list(locks["default"].names()) == []


def test_an_rlocks_alias_cannot_use_a_non_redis_cache(settings: SettingsWrapper) -> None:
    settings.RLOCKS = {"default": {"CACHE": "default"}}
    with pytest.raises(LockSettingError, match="must be a Django Redis cache") as caught:
        locks["default"]
    assert caught.value.check_id == "django_rlock.E003"
