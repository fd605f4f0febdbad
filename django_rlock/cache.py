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
    with cache.lock("report:7", timeout=60, blocking_timeout=5):
        ...  # a 60 s lease; waited at most 5 s for it

:class:`RedisCache` is Django's own ``django.core.cache.backends.redis.RedisCache``
plus :meth:`RedisCache.lock`, a drop-in for django-redis's (and redis-py's)
``lock()``: it returns a :class:`~django_rlock.backends._cachelock.CacheLock`, the core
reentrant lock over the cache's connection pool, with redis-py's keywords and
exceptions. Lock keys are namespaced like cache keys, with the
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
from collections.abc import Callable
from typing import Any

import redis
from django.conf import settings
from django.core.cache import InvalidCacheBackendError, caches
from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.signals import setting_changed
from django.dispatch import receiver

# Imported for what it registers: the old module path of the cache lock's errors,
# which a Celery result stored before the move names (see the module).
from django_rlock import _cache_lock  # noqa: F401
from django_rlock import _conf as conf
from django_rlock.backends._cachelock import CacheLock
from django_rlock.core import LockClient
from django_rlock.core._faces import (
    check_key_prefix,
    check_lease,
    check_name,
    check_timeout,
    forking,
)
from django_rlock.core.defaults import DEFAULT_DEADLOCK_TIMEOUT
from django_rlock.exceptions import LockSettingError

__all__ = ["RedisCache", "check_lock_cache", "lock_client_for"]

#: The cache key under which a cache's locks are namespaced.
LOCK_KEY = "rlock"

_shared_clients: dict[tuple[tuple[str, ...], str, float, float | None], LockClient] = {}
_shared_clients_lock = threading.Lock()


@forking.after_fork_in_child
def _reset_after_fork() -> None:
    global _shared_clients_lock  # noqa: PLW0603 -- a mutex held across fork stays held in the child
    _shared_clients_lock = threading.Lock()


class RedisCache(DjangoRedisCache):
    """Django's Redis cache with :meth:`lock`."""

    def lock(
        self,
        name: str,
        *,
        version: int | None = None,
        timeout: float | None = None,
        sleep: float = 0.1,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        lock_class: object = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        client: object = None,
    ) -> CacheLock:
        """A reentrant lock called ``name`` on this cache's server, as django-redis's.

        The keywords are django-redis's and redis-py's (``Redis.lock()``):

        * ``version``: the cache key version (default: the cache's ``VERSION``);
        * ``timeout``: the lease in seconds; None (the default) keeps the lock
          alive through the watchdog until it is released (redis-py: no
          expiry), so a holder that dies frees it within the watchdog timeout;
        * ``blocking`` / ``blocking_timeout``: whether ``acquire()`` and ``with``
          wait, and for at most how many seconds (None: as long as it takes);
        * ``sleep``: accepted and ignored: waiters are woken by the release (or
          the end of the holder's lease), never by a poll;
        * ``raise_on_release_error``: False makes ``with`` log, not raise, a
          release that finds the lock lost or not held;
        * ``thread_local``: True is how this lock always works (each thread is
          its own owner); False (another thread may release) is refused;
        * ``lock_class`` (redis-py) and ``client`` (django-redis) are refused
          unless None: the lock is django-rlock's, on the cache's own pool.

        Every keyword must be named: django-redis and redis-py order them
        differently, so a positional call could not mean the same in both.
        """
        if lock_class is not None:
            raise ValueError(
                f"cache.lock(lock_class={lock_class!r}) is not supported: the lock is "
                "django-rlock's CacheLock; use redis-py's Redis.lock() for another class"
            )
        if client is not None:
            raise ValueError(
                "cache.lock(client=...) is not supported: the lock uses the cache's own "
                "connection pool (use an RLOCKS alias for another server)"
            )
        if not thread_local:
            raise ValueError(
                "cache.lock(thread_local=False) is not supported: a lock is owned by the "
                "thread that acquired it, so another thread cannot release it"
            )
        del sleep  # redis-py's poll interval: nothing polls here
        lease = _seconds(check_lease, timeout, "timeout", "the lease")
        wait = _seconds(check_timeout, blocking_timeout, "blocking_timeout", "the longest wait")
        prefix = cache_lock_prefix(self, version)
        lock_client = _shared_client(
            self, prefix, conf.watchdog_timeout(None), conf.deadlock_timeout(None)
        )
        return CacheLock(
            lock_client,
            check_name(name),
            timeout=wait,
            lease=lease,
            blocking=blocking,
            raise_on_release_error=raise_on_release_error,
        )


def _seconds(
    check: Callable[[object], float | None], value: object, keyword: str, meaning: str
) -> float | None:
    """``check(value)``, its ValueError reworded to name the keyword the caller used."""
    try:
        return check(value)
    except ValueError as error:
        raise ValueError(f"cache.lock({keyword}=...) is {meaning}: {error}") from None


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


def _shared_client(
    cache: DjangoRedisCache,
    prefix: str,
    watchdog_timeout: float,
    deadlock_timeout: float | None = DEFAULT_DEADLOCK_TIMEOUT,
) -> LockClient:
    servers: list[str] = cache._servers  # type: ignore[attr-defined]  # Django's own attribute
    key = (tuple(servers), prefix, watchdog_timeout, deadlock_timeout)
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
                    deadlock_timeout=deadlock_timeout,
                )
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
    cache_alias: str,
    *,
    key_prefix: str | None,
    watchdog_timeout: float,
    deadlock_timeout: float | None = DEFAULT_DEADLOCK_TIMEOUT,
) -> LockClient:
    """The shared lock client over a cache's pool; ``key_prefix=None`` uses the cache's.

    ``deadlock_timeout`` as for :class:`~django_rlock.core.LockClient`.
    """
    cache = check_lock_cache(cache_alias, f"cache {cache_alias!r}")
    prefix = cache_lock_prefix(cache) if key_prefix is None else key_prefix
    return _shared_client(cache, prefix, watchdog_timeout, deadlock_timeout)


@receiver(setting_changed)
def _close_shared_clients(*, setting: str, **kwargs: Any) -> None:
    """Forget the shared clients when CACHES changes (in tests); held locks expire."""
    if setting != "CACHES":
        return
    with _shared_clients_lock:
        clients = list(_shared_clients.values())
        _shared_clients.clear()
    for client in clients:
        client.close()
