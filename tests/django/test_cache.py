"""django_rlock.cache.RedisCache: cache.lock() with the cache's KEY_PREFIX and VERSION,
a drop-in for django-redis's and redis-py's lock().

The drop-in tests run one body twice: on ``cache.lock()`` and on redis-py's own
``Redis.lock()``, for the keywords and behaviours the two share, so a
difference from redis-py's semantics fails here.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import pickle
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import celery
import pytest
import redis
from django.core.cache import caches
from django.test import Client
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock import locks
from django_rlock.backends import _cachelock
from django_rlock.backends._cachelock import CacheLock
from django_rlock.cache import RedisCache
from django_rlock.core import LockLostError, LockNotOwnedError, LockTimeout, RLock
from django_rlock.exceptions import LockSettingError

HANG = 10.0  # seconds: only ever reached when something hangs


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
    lock = cache.lock("report:1", blocking_timeout=0)
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


# -- a drop-in for redis-py's Lock ----------------------------------------------------


class Locks:
    """Makes locks of one implementation; ``key(name)`` is the Redis key of lock ``name``."""

    def __init__(self, make: Callable[..., Any], key: Callable[[str], str]) -> None:
        self.make = make
        self.key = key


@pytest.fixture(params=["cache.lock", "redis-py"])
def impl(request: pytest.FixtureRequest, redis_caches: None, redis_url: str) -> Iterator[Locks]:
    if request.param == "redis-py":
        client = redis.Redis.from_url(redis_url)
        yield Locks(client.lock, lambda name: name)
        client.close()
        return
    cache = caches["shop"]
    assert isinstance(cache, RedisCache)
    yield Locks(cache.lock, lambda name: f"shop:3:rlock:{{{name}}}")


@contextmanager
def held_elsewhere(
    impl: Locks, name: str, *, timeout: float | None = None
) -> Iterator[threading.Thread]:
    """Lock ``name`` taken by another thread (another owner) for the block."""
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        lock = impl.make(name, timeout=timeout)
        assert lock.acquire(blocking_timeout=HANG)
        held.set()
        done.wait(HANG)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert held.wait(HANG), f"could not take {name!r}"
    try:
        yield thread
    finally:
        done.set()
        thread.join(HANG)


def test_timeout_is_the_lease(impl: Locks, r: redis.Redis) -> None:
    lock = impl.make("job", timeout=5)
    assert lock.acquire()
    assert 4000 < r.pttl(impl.key("job")) <= 5000
    assert lock.locked() and lock.owned()
    lock.release()
    assert not lock.locked() and not r.exists(impl.key("job"))


def test_sleep_is_accepted(impl: Locks) -> None:
    with impl.make("job", sleep=0.5, blocking_timeout=1) as lock:
        assert lock.owned()


def test_blocking_false_gives_up_at_once(impl: Locks) -> None:
    with held_elsewhere(impl, "job"):
        lock = impl.make("job", blocking=False)
        assert lock.acquire() is False
        assert impl.make("job").acquire(blocking=False) is False
        assert lock.locked() and not lock.owned()


def test_blocking_timeout_bounds_the_wait_and_with_raises_lock_error(impl: Locks) -> None:
    with held_elsewhere(impl, "job"):
        lock = impl.make("job", blocking_timeout=0.2)
        assert lock.acquire() is False
        assert impl.make("job").acquire(blocking_timeout=0.2) is False
        with pytest.raises(redis.exceptions.LockError), lock:
            pass


def test_a_waiter_gets_the_lock_when_the_holders_lease_ends(impl: Locks) -> None:
    with held_elsewhere(impl, "job", timeout=0.3):
        lock = impl.make("job", blocking_timeout=HANG)
        assert lock.acquire()
        assert lock.owned()
        lock.release()


def test_releasing_a_lock_not_held_raises_lock_error(impl: Locks) -> None:
    lock = impl.make("job")
    with pytest.raises(redis.exceptions.LockError):
        lock.release()


def test_releasing_a_lock_taken_over_raises_lock_not_owned_error(impl: Locks) -> None:
    lock = impl.make("job", timeout=0.3)
    assert lock.acquire()
    with held_elsewhere(impl, "job"):  # after the lease ran out
        with pytest.raises(redis.exceptions.LockNotOwnedError):
            lock.release()
        assert lock.locked()  # the new holder's lock is left alone


#: redis-py's Lock took ``raise_on_release_error`` in 6.0; before that only ours has it.
RELEASE_ERROR_IMPLS = ["cache.lock"] + (
    ["redis-py"]
    if "raise_on_release_error" in inspect.signature(redis.Redis.lock).parameters
    else []
)


@pytest.mark.parametrize("impl", RELEASE_ERROR_IMPLS, indirect=True)
def test_raise_on_release_error_false_only_logs(
    impl: Locks, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.WARNING),
        impl.make("job", timeout=0.3, raise_on_release_error=False),
        held_elsewhere(impl, "job"),
    ):
        pass  # the lease ran out and another owner took the lock in the block
    told = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert any("no longer owned" in message or "was lost" in message for message in told)


# -- what only cache.lock() does ------------------------------------------------------


@pytest.mark.usefixtures("redis_caches")
def test_cache_lock_errors_are_django_rlock_errors_too() -> None:
    cache = caches["shop"]
    assert isinstance(cache, RedisCache)
    lock = cache.lock("job", timeout=0.3)
    with pytest.raises(LockNotOwnedError) as not_owned:
        lock.release()
    assert isinstance(not_owned.value, redis.exceptions.LockNotOwnedError)
    assert not_owned.value.name == not_owned.value.lock_name == "job"
    assert lock.acquire()
    with held_elsewhere(Locks(cache.lock, str), "job"):
        with pytest.raises(LockLostError) as lost:
            lock.release()
        assert isinstance(lost.value, redis.exceptions.LockNotOwnedError)
        with pytest.raises(LockTimeout) as busy, cache.lock("job", blocking_timeout=0):
            pass
    assert isinstance(busy.value, redis.exceptions.LockError)
    assert busy.value.retry_after is not None


#: ``CacheLockTimeout("busy", name="report:1", retry_after=2.0)`` pickled (protocol 0)
#: when the cache lock lived in ``django_rlock/_cache_lock.py`` (commit aeac071):
#: what a Celery result stored by that version with the pickle serializer holds.
PICKLED_BEFORE_THE_MOVE = (
    b"cdjango_rlock.core.exceptions\n_rebuild\np0\n(cdjango_rlock._cache_lock\n"
    b"CacheLockTimeout\np1\n(Vbusy\np2\ntp3\n(dp4\nVname\np5\nVreport:1\np6\n"
    b"sVretry_after\np7\nF2.0\nsVmessage\np8\ng2\nsVlock_name\np9\ng6\nstp10\nRp11\n."
)


def test_an_error_pickled_under_the_cache_locks_old_path_still_loads() -> None:
    loaded = pickle.loads(PICKLED_BEFORE_THE_MOVE)
    assert type(loaded) is _cachelock.CacheLockTimeout
    assert (str(loaded), loaded.name, loaded.lock_name, loaded.retry_after) == (
        "busy",
        "report:1",
        "report:1",
        2.0,
    )


@pytest.mark.parametrize(
    "error", ["CacheLockTimeout", "CacheLockNotOwnedError", "CacheLockLostError"]
)
def test_celery_loads_an_error_stored_in_json_under_the_cache_locks_old_path(error: str) -> None:
    # Celery's JSON reader looks the module up among those imported only: the
    # cache face imports the old path, so a process that uses it can read it.
    importlib.import_module("django_rlock.cache")
    app = celery.Celery("old-results", set_as_current=False)
    stored = {"exc_type": error, "exc_module": "django_rlock._cache_lock", "exc_message": ["x"]}
    loaded = app.backend.exception_to_python(stored)
    assert type(loaded) is getattr(_cachelock, error)
    assert str(loaded) == "x"


#: The previous release's interpreter (noxfile.PREVIOUS_RELEASE, made by ``make test``).
PREVIOUS = os.environ.get("RLOCK_PREVIOUS_PYTHON", "")

#: Run by the previous release: loads a pickled error from stdin and says what it is.
LOAD_IN_THE_PREVIOUS_RELEASE = """
import pickle, sys
error = pickle.loads(sys.stdin.buffer.read())
print(type(error).__module__, type(error).__name__, str(error), error.name)
"""


@pytest.mark.skipif(not PREVIOUS, reason="RLOCK_PREVIOUS_PYTHON names no previous release")
@pytest.mark.parametrize("error", [_cachelock.CacheLockTimeout, _cachelock.CacheLockLostError])
def test_an_error_stored_by_this_version_loads_in_the_previous_release(
    error: type[_cachelock.CacheLockTimeout | _cachelock.CacheLockLostError], tmp_path: Path
) -> None:
    # A rolling upgrade: a Celery result stored by an upgraded worker is read
    # by a process not yet upgraded, which has no django_rlock.backends._cachelock.
    # Pickled (the pickle serializer) and named in JSON (exc_module) by the
    # module path both versions have.
    assert error.__module__ == "django_rlock._cache_lock"
    stored = pickle.dumps(error("busy", name="report:1"))
    loaded = subprocess.run(
        [PREVIOUS, "-I", "-c", LOAD_IN_THE_PREVIOUS_RELEASE],
        input=stored,
        capture_output=True,
        cwd=tmp_path,  # outside the source tree: the previous release's own package
        check=False,
        timeout=60,
    )
    assert loaded.returncode == 0, loaded.stderr.decode()
    assert loaded.stdout.decode().split() == [
        "django_rlock._cache_lock",
        error.__name__,
        "busy",
        "report:1",
    ]
    assert sys.executable != PREVIOUS


@pytest.mark.usefixtures("redis_caches")
def test_cache_lock_is_reentrant_and_watchdog_renewed(r: redis.Redis) -> None:
    cache = caches["shop"]
    assert isinstance(cache, RedisCache)
    lock = cache.lock("job")
    assert isinstance(lock, CacheLock)
    with lock:
        token = lock.token
        with lock:  # redis-py's Lock would wait for itself here
            assert lock.hold_count() == 2 and lock.token == token is not None
        ttl = lock.ttl()
        assert ttl is not None and ttl <= 30  # the watchdog's timeout, not "forever"
    assert not r.exists("shop:3:rlock:{job}")


@pytest.mark.usefixtures("redis_caches")
@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"thread_local": False}, "thread_local=False) is not supported"),
        ({"lock_class": object}, "lock_class=<class 'object'>) is not supported"),
        ({"client": object()}, "client=...) is not supported"),
        ({"timeout": 0}, "timeout=...) is the lease: lease must be > 0"),
        (
            {"blocking_timeout": -1},
            "blocking_timeout=...) is the longest wait: timeout must be >= 0",
        ),
    ],
)
def test_cache_lock_refuses_what_it_cannot_honour(keywords: dict[str, Any], message: str) -> None:
    cache = caches["shop"]
    assert isinstance(cache, RedisCache)
    with pytest.raises(ValueError, match=re.escape(message)):
        cache.lock("job", **keywords)


@pytest.mark.usefixtures("redis_caches")
def test_cache_lock_acquire_refuses_a_token_and_two_waits() -> None:
    cache = caches["shop"]
    assert isinstance(cache, RedisCache)
    lock = cache.lock("job")
    with pytest.raises(ValueError, match=re.escape("token=...) is not supported")):
        lock.acquire(token="mine")
    with pytest.raises(ValueError, match="timeout or blocking_timeout"):
        lock.acquire(timeout=1, blocking_timeout=1)
    with pytest.raises(TypeError):
        cache.lock("job", None, 10)  # type: ignore[call-arg]  # positional order differs between peers
    assert not lock.locked()


# -- a busy cache.lock() in a view --------------------------------------------------------


@pytest.mark.urls("tests.django.cache_urls")
@pytest.mark.usefixtures("redis_caches")
@pytest.mark.parametrize("lease", [3.0, None], ids=["lease-3s", "watchdog"])
def test_a_busy_cache_lock_answers_the_holders_time_not_its_lease(
    settings: SettingsWrapper, lease: float | None
) -> None:
    """Retry-After follows rlock()'s rule (the holder's time so far), not the TTL left.

    The holder has just taken the lock: 1 s, where the TTL left said 3 s (a
    3 s lease) or 30 s (the watchdog's timeout).
    """
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django_rlock.middleware.LockErrorMiddleware"]
    cache = caches["shop"]
    assert isinstance(cache, RedisCache)
    with held_elsewhere(Locks(cache.lock, str), "report:1", timeout=lease):
        query = {} if lease is None else {"lease": str(lease)}
        response = Client().get("/report/1/", query)
        with pytest.raises(LockTimeout) as busy, cache.lock("report:1", blocking_timeout=0):
            pass
    assert response.status_code == 409
    assert response["Retry-After"] == "1"
    assert busy.value.retry_after is not None and busy.value.retry_after < 2


@pytest.mark.usefixtures("redis_caches")
def test_cache_lock_refuses_a_timeout_with_blocking_false() -> None:
    # As every lock kind (and threading.Lock); redis-py's blocking_timeout is
    # still ignored with blocking=False, as redis-py ignores it.
    cache = caches["shop"]
    assert isinstance(cache, RedisCache)
    lock = cache.lock("strict")
    with pytest.raises(ValueError, match="non-blocking"):
        lock.acquire(blocking=False, timeout=5)
    assert lock.acquire(blocking=False, blocking_timeout=5) is True
    lock.release()
