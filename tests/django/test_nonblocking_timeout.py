"""The Django face refuses ``blocking=False`` with a timeout on every kind and backend.

As ``threading.Lock.acquire`` does (ValueError, "can't specify a timeout for a
non-blocking call"): on the Redis, LocMem and cache-backed aliases, for the
lock, the fair lock, both sides of the read-write lock and the semaphore,
their asyncio twins, and the ``rlock()`` / ``semaphore()`` shortcuts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock import rlock, semaphore
from django_rlock._handler import locks

REFUSED = r"can't specify a timeout for a non-blocking call"

ALIASES = ["default", "mem", "cached"]

KINDS: dict[str, Callable[..., Any]] = {
    "lock": lambda b, **o: b.lock("nb", **o),
    "fair": lambda b, **o: b.fair_lock("nb", **o),
    "read": lambda b, **o: b.read_write_lock("nb", **o).read,
    "write": lambda b, **o: b.read_write_lock("nb", **o).write,
    "semaphore": lambda b, **o: b.semaphore("nb-sem", 2, **o),
}

ASYNC_KINDS: dict[str, Callable[..., Any]] = {
    "lock": lambda b, **o: b.async_lock("nb", **o),
    "fair": lambda b, **o: b.async_fair_lock("nb", **o),
    "read": lambda b, **o: b.async_read_write_lock("nb", **o).read,
    "write": lambda b, **o: b.async_read_write_lock("nb", **o).write,
    "semaphore": lambda b, **o: b.async_semaphore("nb-sem", 2, **o),
}


@pytest.fixture(autouse=True)
def cached_alias(settings: SettingsWrapper, rlocks: dict[str, Any], redis_url: str) -> None:
    """A third alias on a Django Redis cache's servers."""
    settings.CACHES = {
        **settings.CACHES,
        "redis": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": redis_url},
    }
    settings.RLOCKS = {**rlocks, "cached": {"CACHE": "redis", "KEY_PREFIX": "t"}}


@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_of_every_alias_refuses_it(alias: str, kind: str) -> None:
    backend = locks[alias]
    with pytest.raises(ValueError, match=REFUSED):
        KINDS[kind](backend, blocking=False, timeout=5)
    lock = KINDS[kind](backend)
    with pytest.raises(ValueError, match=REFUSED):
        lock.acquire(blocking=False, timeout=5)
    assert lock.acquire(blocking=False, timeout=None)
    lock.release()


@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.parametrize("kind", sorted(ASYNC_KINDS))
def test_every_asyncio_kind_refuses_it(alias: str, kind: str) -> None:
    backend = locks[alias]

    async def native() -> None:
        with pytest.raises(ValueError, match=REFUSED):
            ASYNC_KINDS[kind](backend, blocking=False, timeout=5)
        lock = ASYNC_KINDS[kind](backend)
        if not hasattr(lock, "acquire"):
            return  # a thread-owned twin only has ``async with``: refused when built
        with pytest.raises(ValueError, match=REFUSED):
            await lock.acquire(blocking=False, timeout=5)

    asyncio.run(native())


@pytest.mark.parametrize("alias", ALIASES)
def test_the_shortcuts_refuse_it(alias: str) -> None:
    with pytest.raises(ValueError, match=REFUSED):
        rlock("nb", using=alias, blocking=False, timeout=5)
    with pytest.raises(ValueError, match=REFUSED):
        semaphore("nb-sem", 2, using=alias, blocking=False, timeout=5)
    with rlock("nb", using=alias, blocking=False, timeout=None):
        pass
