"""conf's lookup order and errors; the ``locks`` handler's sharing and resets."""

from __future__ import annotations

import subprocess
import sys
import threading
import warnings
from typing import Any

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory, override_settings
from pytest_django.fixtures import Settings as SettingsWrapper

import django_rlock
from django_rlock import _conf as conf
from django_rlock import locks, rlock
from django_rlock._handler import create_backend
from django_rlock.backends.locmem import LocMemLockBackend
from django_rlock.backends.redis import RedisLockBackend
from django_rlock.core import LockNotReplicatedError
from django_rlock.exceptions import InvalidLockBackendError, LockLostError, LockSettingError

LOCMEM = "django_rlock.backends.locmem.LocMemLockBackend"


def test_lookup_order_keyword_alias_global_default(
    settings: SettingsWrapper, rlocks: dict[str, Any]
) -> None:
    assert conf.lookup("SLOW_WAIT", "default") == (None, "the default SLOW_WAIT")
    settings.RLOCK_SLOW_WAIT = 2
    assert conf.lookup("SLOW_WAIT", "default") == (2, "RLOCK_SLOW_WAIT")
    settings.RLOCKS = {**rlocks, "default": {**rlocks["default"], "SLOW_WAIT": 3}}
    assert conf.lookup("SLOW_WAIT", "default") == (3, "RLOCKS['default']['SLOW_WAIT']")
    assert conf.lookup("SLOW_WAIT", "mem") == (2, "RLOCK_SLOW_WAIT")
    assert conf.lookup("SLOW_WAIT", "default", value=None)[0] is None
    assert conf.lookup("SLOW_WAIT", None) == (2, "RLOCK_SLOW_WAIT")


def test_global_watchdog_timeout_applies_to_aliases_without_their_own(
    settings: SettingsWrapper, redis_url: str
) -> None:
    settings.RLOCK_WATCHDOG_TIMEOUT = 12
    settings.RLOCKS = {"default": {"LOCATION": redis_url}, "own": {"WATCHDOG_TIMEOUT": 4}}
    assert locks["default"].watchdog_timeout == 12.0
    assert locks["own"].watchdog_timeout == 4.0
    with rlock("wd") as lock:
        ttl = lock.ttl()
        assert ttl is not None and 11 < ttl <= 12


def test_unknown_setting_name_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="not a django-rlock setting"):
        conf.lookup("WATCHDOG")


@pytest.mark.parametrize(
    ("params", "message", "check_id"),
    [
        ({"WATCHDOG_TIMEOUT": 0}, "RLOCKS['bad']['WATCHDOG_TIMEOUT'] must be a positive", "E004"),
        ({"WATCHDOG_TIMEOUT": "30"}, "must be a positive number", "E004"),
        (
            {"WATCHDOG_TIMEOUT": 0.2},
            "RLOCKS['bad']['WATCHDOG_TIMEOUT']: watchdog_timeout must be at least 0.5 seconds",
            "E004",
        ),
        ({"SLOW_HOLD": -1}, "RLOCKS['bad']['SLOW_HOLD'] must be >= 0", "E004"),
        (
            {"KEY_PREFIX": "a{b}"},
            "RLOCKS['bad']['KEY_PREFIX']: key_prefix must not contain",
            "E005",
        ),
        ({"LOCATION": "http://x"}, "must be a redis URL", "E003"),
        ({"LOCATION": "redis://h:notaport/0"}, "not a valid redis URL", "E003"),
        ({"LOCATION": "redis://x", "CACHE": "default"}, "both LOCATION and CACHE", "E003"),
        ({"CACHE": "nope"}, "not a cache alias in CACHES", "E003"),
        ({"CACHE": "default"}, "must be a Django Redis cache", "E003"),
        ({"OPTIONS": []}, "OPTIONS'] must be a dict", "E003"),
        ({"BACKEND": "no.such.Backend"}, "could not be imported", "E002"),
        ({"BACKEND": "django_rlock._conf.lookup"}, "is not a lock backend", "E002"),
    ],
)
def test_bad_alias_settings_are_improperly_configured(
    settings: SettingsWrapper, params: dict[str, Any], message: str, check_id: str
) -> None:
    settings.RLOCKS = {"default": {}, "bad": params}
    with pytest.raises(LockSettingError, match=message.replace("[", r"\[")) as caught:
        locks["bad"]
    assert isinstance(caught.value, ImproperlyConfigured)
    assert caught.value.check_id == f"django_rlock.{check_id}"


@pytest.mark.parametrize(
    ("params", "message", "check_id"),
    [
        ({"LOCATON": "redis://x"}, "RLOCKS['bad'] has an unknown key 'LOCATON'", "E007"),
        ({"OPTIONS": {"pasword": "x"}}, "OPTIONS'] has an unknown key 'pasword'", "E007"),
        ({"CACHE": "redis", "OPTIONS": {"db": 1}}, "not an option of an alias using CACHE", "E007"),
        (
            {"BACKEND": "django_rlock.backends.locmem.LocMemLockBackend", "OPTIONS": {"db": 1}},
            "not an option of the LocMem backend",
            "E007",
        ),
        (
            {"OPTIONS": {"socket_timeout": "5"}},
            "RLOCKS['bad']['OPTIONS']['socket_timeout'] must be a number or None, got '5'",
            "E003",
        ),
        (
            {"OPTIONS": {"ssl": "yes"}},
            "RLOCKS['bad']['OPTIONS']['ssl'] must be True or False",
            "E003",
        ),
    ],
)
def test_unknown_keys_and_wrong_option_types_are_refused_when_built(
    settings: SettingsWrapper, params: dict[str, Any], message: str, check_id: str
) -> None:
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "redis": {"BACKEND": "django_rlock.cache.RedisCache", "LOCATION": "redis://127.0.0.1:1"},
    }
    settings.RLOCKS = {"default": {}, "bad": params}
    with pytest.raises(LockSettingError) as caught:
        locks["bad"]
    assert message in str(caught.value)
    assert caught.value.check_id == f"django_rlock.{check_id}"


def test_redis_py_options_are_accepted_and_used(
    settings: SettingsWrapper, redis_url: str, r: redis.Redis
) -> None:
    options = {"socket_timeout": 5, "health_check_interval": 10, "client_name": "rlock-opts"}
    settings.RLOCKS = {"default": {"LOCATION": redis_url, "OPTIONS": options}}
    with locks["default"].lock("opts"):
        names = [client.get("name") for client in r.client_list()]
    assert "rlock-opts" in names


def test_unknown_alias_is_an_invalid_lock_backend_error() -> None:
    with pytest.raises(InvalidLockBackendError, match="'nope' is not in RLOCKS") as caught:
        locks["nope"]
    assert isinstance(caught.value, ImproperlyConfigured)
    assert django_rlock.InvalidLockBackendError is InvalidLockBackendError


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"x": {}}, "must define a 'default'"),
        ([], "must be a dict of lock aliases"),
        ({"default": "redis://"}, "must map a str alias to a dict"),
    ],
)
def test_malformed_rlocks(settings: SettingsWrapper, value: object, message: str) -> None:
    settings.RLOCKS = value
    with pytest.raises(LockSettingError, match=message) as caught:
        locks["default"]
    assert caught.value.check_id == "django_rlock.E001"


def test_without_rlocks_the_default_alias_is_local_redis(settings: SettingsWrapper) -> None:
    del settings.RLOCKS
    backend = locks["default"]  # built without connecting
    assert isinstance(backend, RedisLockBackend)
    assert backend.location == "redis://127.0.0.1:6379/0"
    assert (backend.key_prefix, backend.watchdog_timeout) == ("rlock", 30.0)
    assert list(locks) == ["default"]


def test_one_backend_and_one_client_per_alias_shared_by_threads() -> None:
    seen: list[Any] = []
    barrier = threading.Barrier(6)

    def look() -> None:
        barrier.wait(10)
        backend = locks["default"]
        seen.append((backend, backend.client))  # type: ignore[attr-defined]

    threads = [threading.Thread(target=look) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(seen) == 6
    assert len({id(backend) for backend, _ in seen}) == 1
    assert len({id(client) for _, client in seen}) == 1
    assert locks.all(initialized_only=True) == [locks["default"]]
    assert "mem" in locks and "nope" not in locks


def test_override_settings_switches_prefix_and_backend_mid_test(
    rlocks: dict[str, Any], r: redis.Redis
) -> None:
    before = locks["default"]
    with rlock("switch"):
        assert r.exists("t:{switch}")
    with override_settings(RLOCKS={"default": {**rlocks["default"], "KEY_PREFIX": "other"}}):
        assert locks["default"] is not before
        with rlock("switch"):
            assert r.exists("other:{switch}") and not r.exists("t:{switch}")
    with override_settings(RLOCKS={"default": {"BACKEND": LOCMEM}}):
        assert isinstance(locks["default"], LocMemLockBackend)
        with rlock("switch") as lock:
            assert lock.locked()
            # The Redis locks left their releases' latches (the last token
            # with each releasing owner's request id), which expire in a minute.
            kept = sorted(r.keys("*"))
            assert kept == [b"other:{switch}:req", b"t:{switch}:req"]
    assert isinstance(locks["default"], RedisLockBackend)
    assert locks["default"] is not before


def test_a_settings_change_that_closes_a_holding_client_reports_the_hold_lost(
    rlocks: dict[str, Any],
) -> None:
    """override_settings closes the backend: its watchdog holds can no longer be renewed."""
    from django_rlock.signals import lock_lost  # noqa: PLC0415

    lost = threading.Event()
    received: list[dict[str, Any]] = []

    def on_lost(**kwargs: Any) -> None:
        received.append(kwargs)
        lost.set()

    lock_lost.connect(on_lost)
    try:
        lock = locks["default"].lock("closed-under-me")
        assert lock.acquire()
        with override_settings(RLOCKS={"default": {**rlocks["default"], "KEY_PREFIX": "other"}}):
            assert lock.lost
            assert lost.wait(10)
        with pytest.raises(LockLostError):
            lock.release()
    finally:
        lock_lost.disconnect(on_lost)
    assert received[0]["name"] == "closed-under-me" and received[0]["alias"] == "default"


def test_two_threads_in_one_request_cycle_share_the_alias_and_exclude_each_other() -> None:
    # Two threads of one request take the same lock: each is its own owner.
    order: list[str] = []

    def worker(tag: str) -> None:
        with rlock("cycle", timeout=10):
            order.append(f"{tag}-in")
            order.append(f"{tag}-out")

    def view(request: HttpRequest) -> HttpResponse:
        threads = [threading.Thread(target=worker, args=(tag,)) for tag in "ab"]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        return HttpResponse("done")

    assert view(RequestFactory().get("/")).status_code == 200
    assert sorted(order) == ["a-in", "a-out", "b-in", "b-out"]
    assert order[0][0] == order[1][0] and order[2][0] == order[3][0]  # never interleaved


def test_rlock_uses_the_alias_and_raises_lock_timeout(r: redis.Redis) -> None:
    with rlock("x", using="mem") as lock:
        assert lock.owned() and r.dbsize() == 0
    holder = threading.Thread(target=lambda: locks["default"].lock("busy").acquire(lease=5))
    holder.start()
    holder.join(10)
    with pytest.raises(django_rlock.exceptions.LockTimeout), rlock("busy", blocking=False):
        pytest.fail("acquired a busy lock")
    with pytest.raises(InvalidLockBackendError):
        rlock("x", using="missing")


def test_create_backend_checks_the_backend_path_type(settings: SettingsWrapper) -> None:
    with pytest.raises(InvalidLockBackendError, match="must be a dotted path"):
        create_backend("x", {"BACKEND": 42})


def test_package_exports_lazily_without_settings() -> None:
    # Which names: tests/test_public_api.py pins them. Each one resolves on first use.
    assert [name for name in django_rlock.__all__ if not hasattr(django_rlock, name)] == []
    code = (
        "import django_rlock, django_rlock.core, sys\n"
        "assert 'django_rlock._handler' not in sys.modules\n"
        "from django.conf import settings\n"
        "assert not settings.configured\n"
        "print('ok')\n"
    )
    env = {"PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.stdout.strip() == "ok", result.stderr
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        django_rlock.nothing  # noqa: B018


def test_a_forked_child_uses_the_parents_backend_with_its_own_identity(r: redis.Redis) -> None:
    import os  # noqa: PLC0415

    backend = locks["default"]
    lock = backend.lock("forked")
    lock.acquire()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: not the owner, and the handler is usable
        try:
            child = locks["default"].lock("forked")
            report = (
                f"{child.owned()} {child.acquire(blocking=False)} {locks['default'] is backend}"
            )
            os.write(write, report.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        report = pipe.read()
    os.waitpid(pid, 0)
    lock.release()
    assert report == "False False True"


def test_min_replicas_reaches_the_lock_client(
    settings: SettingsWrapper, redis_url: str, r: redis.Redis
) -> None:
    settings.RLOCKS = {
        "default": {"LOCATION": redis_url, "MIN_REPLICAS": 1, "REPLICA_SYNC_TIMEOUT": 0.1}
    }
    lock = locks["default"].lock("replicated")
    # The test server has no replica: the grant is undone and refused.
    with pytest.raises(LockNotReplicatedError):
        lock.acquire()
    assert not r.exists("rlock:{replicated}")
    settings.RLOCKS = {"default": {"LOCATION": redis_url, "MIN_REPLICAS": -1}}
    with pytest.raises(LockSettingError, match="MIN_REPLICAS"):
        locks["default"].lock("x")


def test_locks_used_without_the_app_installed_warn_once(
    settings: SettingsWrapper, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_rlock import _handler  # noqa: PLC0415

    monkeypatch.setattr(_handler, "_hinted", False)
    installed = [app for app in settings.INSTALLED_APPS if app != "django_rlock"]
    with override_settings(INSTALLED_APPS=installed):
        with pytest.warns(_handler.MissingAppWarning, match="INSTALLED_APPS"):
            _handler.create_backend("default")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _handler.create_backend("default")  # once per process
    monkeypatch.setattr(_handler, "_hinted", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _handler.create_backend("default")  # installed: no warning
