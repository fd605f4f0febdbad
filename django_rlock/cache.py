"""A Django Redis cache that also hands out locks: ``cache.lock(name)``.

::

    CACHES = {
        "default": {
            "BACKEND": "django_rlock.cache.RedisCache",
            "LOCATION": "redis://127.0.0.1:6379/1",
            "KEY_PREFIX": "shop",
            "VERSION": 2,
        }
    }

    from django.core.cache import cache
    with cache.lock("report:7", timeout=5):
        ...

:class:`RedisCache` is Django's own ``django.core.cache.backends.redis.RedisCache``
plus :meth:`RedisCache.lock`, which returns the core :class:`RLock` over the
cache's connection pool. Lock keys are namespaced like cache keys, with the
cache's ``KEY_PREFIX``, ``VERSION`` and ``KEY_FUNCTION``:
``cache.make_key("rlock", version)`` is the lock prefix, so the lock ``x`` of
the cache above lives at ``shop:2:rlock:{x}``. ``cache.clear()`` flushes the
database and so deletes held locks too.

An ``RLOCKS`` alias can use a cache's servers instead of its own ``LOCATION``
(``{"CACHE": "default"}``); any Django Redis cache works there, not only this
subclass.

Django builds a cache object per thread; the lock client behind ``lock()`` is
one per server and prefix per process, so the watchdog and the pub/sub
connection are shared by every thread.
"""

from __future__ import annotations

import threading
from typing import Any

import redis
from django.conf import settings
from django.core.cache import InvalidCacheBackendError, caches
from django.core.cache.backends.redis import RedisCache as DjangoRedisCache

from django_rlock import conf
from django_rlock.core.client import LockClient
from django_rlock.core.lock import RLock
from django_rlock.core.names import check_key_prefix
from django_rlock.exceptions import LockSettingError
from django_rlock.reporting import send_lost

__all__ = ["RedisCache", "check_lock_cache", "lock_client_for"]

#: The cache key under which a cache's locks are namespaced.
LOCK_KEY = "rlock"

_shared_clients: dict[tuple[tuple[str, ...], str, float], LockClient] = {}
_shared_clients_lock = threading.Lock()


class RedisCache(DjangoRedisCache):
    """Django's Redis cache with :meth:`lock`."""

    def lock(
        self,
        name: str,
        *,
        version: int | None = None,
        timeout: float | None = None,
        lease: float | None = None,
        blocking: bool = True,
    ) -> RLock:
        """A reentrant lock called ``name`` on this cache's server.

        ``version`` defaults to the cache's ``VERSION``; ``timeout``, ``lease``
        and ``blocking`` are the defaults ``with lock:`` uses, as for
        :meth:`django_rlock.core.LockClient.lock`.
        """
        prefix = cache_lock_prefix(self, version)
        client = _shared_client(self, prefix, conf.watchdog_timeout(None))
        return client.lock(name, timeout=timeout, lease=lease, blocking=blocking)


def cache_lock_prefix(cache: DjangoRedisCache, version: int | None = None) -> str:
    """The lock key prefix of ``cache``: its cache key for ``"rlock"``."""
    prefix = cache.make_key(LOCK_KEY, version=version)
    try:
        return check_key_prefix(prefix)
    except ValueError as error:
        raise LockSettingError(
            f"the cache's KEY_PREFIX/KEY_FUNCTION cannot namespace locks: {error}",
            check_id="django_rlock.E005",
        ) from None


def _shared_client(cache: DjangoRedisCache, prefix: str, watchdog_timeout: float) -> LockClient:
    servers: list[str] = cache._servers  # type: ignore[attr-defined]  # Django's own attribute
    key = (tuple(servers), prefix, watchdog_timeout)
    client = _shared_clients.get(key)
    if client is None:
        with _shared_clients_lock:
            client = _shared_clients.get(key)
            if client is None:
                # The cache's own pool (to its first, writable server): the pool
                # is thread-safe, so one cache object's pool serves every thread.
                pool = cache._cache._get_connection_pool(write=True)  # type: ignore[attr-defined]  # Django's own
                client = LockClient(
                    redis.Redis(connection_pool=pool),
                    key_prefix=prefix,
                    watchdog_timeout=watchdog_timeout,
                )
                client.on_lost(send_lost)
                _shared_clients[key] = client
    return client


def check_lock_cache(cache_alias: object, where: str) -> DjangoRedisCache:
    """The cache an RLOCKS alias names with ``CACHE``; LockSettingError unless a Redis cache."""
    if not isinstance(cache_alias, str) or cache_alias not in settings.CACHES:
        raise LockSettingError(
            f"{where}['CACHE'] = {cache_alias!r} is not a cache alias in CACHES",
            check_id="django_rlock.E003",
        )
    try:
        cache = caches[cache_alias]
    except InvalidCacheBackendError as error:
        raise LockSettingError(
            f"{where}['CACHE']: the cache {cache_alias!r} cannot be built: {error}",
            check_id="django_rlock.E003",
        ) from None
    if not isinstance(cache, DjangoRedisCache):
        raise LockSettingError(
            f"{where}['CACHE'] = {cache_alias!r} must be a Django Redis cache "
            f"(django.core.cache.backends.redis.RedisCache or a subclass), "
            f"not {type(cache).__module__}.{type(cache).__qualname__}",
            check_id="django_rlock.E003",
        )
    return cache


def lock_client_for(
    cache_alias: str, *, key_prefix: str | None, watchdog_timeout: float
) -> LockClient:
    """The shared lock client over a cache's pool; ``key_prefix=None`` uses the cache's."""
    cache = check_lock_cache(cache_alias, f"cache {cache_alias!r}")
    prefix = cache_lock_prefix(cache) if key_prefix is None else key_prefix
    return _shared_client(cache, prefix, watchdog_timeout)


def _close_shared_clients(**kwargs: Any) -> None:
    """Forget the shared clients (their caches changed); held locks expire."""
    with _shared_clients_lock:
        clients = list(_shared_clients.values())
        _shared_clients.clear()
    for client in clients:
        client.close()
