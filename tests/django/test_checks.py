"""System checks, through call_command("check") as Django runs them."""

from __future__ import annotations

from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from pytest_django.fixtures import Settings as SettingsWrapper

from tests.servers import free_port

LOCMEM = "django_rlock.backends.locmem.LocMemLockBackend"


def run_check(*args: str) -> str:
    """The check command's report (warnings go to stderr)."""
    out, err = StringIO(), StringIO()
    call_command("check", *args, "--tag", "django_rlock", stdout=out, stderr=err)
    return out.getvalue() + err.getvalue()


def test_valid_settings_pass(settings: SettingsWrapper, rlocks: dict[str, Any]) -> None:
    settings.RLOCKS = {"default": rlocks["default"]}
    assert "no issues" in run_check()


@pytest.mark.pure
@pytest.mark.parametrize(
    ("rlocks", "check_id"),
    [
        ({"other": {}}, "E001"),
        ({"default": {"BACKEND": "no.such.Backend"}}, "E002"),
        ({"default": {"LOCATION": "http://example.com"}}, "E003"),
        ({"default": {"CACHE": "default"}}, "E003"),
        ({"default": {"WATCHDOG_TIMEOUT": 0}}, "E004"),
        ({"default": {"WATCHDOG_TIMEOUT": -5}}, "E004"),
        ({"default": {"SLOW_WAIT": "1s"}}, "E004"),
        ({"default": {"KEY_PREFIX": "{x}"}}, "E005"),
        ({"default": {"BUSY_RESPONSE": 99}}, "E006"),
    ],
)
def test_errors(settings: SettingsWrapper, rlocks: dict[str, Any], check_id: str) -> None:
    settings.RLOCKS = rlocks
    with pytest.raises(SystemCheckError, match=f"django_rlock.{check_id}"):
        run_check()


def test_global_setting_errors_name_the_setting(settings: SettingsWrapper) -> None:
    settings.RLOCKS = {"default": {}}
    settings.RLOCK_WATCHDOG_TIMEOUT = 0
    with pytest.raises(SystemCheckError, match=r"RLOCK_WATCHDOG_TIMEOUT must be a positive"):
        run_check()


def test_locmem_with_debug_off_warns(settings: SettingsWrapper) -> None:
    settings.RLOCKS = {"default": {"BACKEND": LOCMEM}}
    settings.DEBUG = True
    assert "django_rlock.W001" not in run_check()
    settings.DEBUG = False
    assert "django_rlock.W001" in run_check()


@pytest.mark.parametrize(
    ("params", "reported"),
    [
        (
            {"LOCATON": "redis://elsewhere:6379/0"},
            "RLOCKS['default'] has an unknown key 'LOCATON' (did you mean 'LOCATION'?)",
        ),
        ({"options": {}}, "unknown key 'options' (did you mean 'OPTIONS'?)"),
        (
            {"OPTIONS": {"socket_timout": 5}},
            "RLOCKS['default']['OPTIONS'] has an unknown key 'socket_timout' "
            "(did you mean 'socket_timeout'?)",
        ),
    ],
)
def test_unknown_keys_are_errors_with_the_close_match(
    settings: SettingsWrapper, params: dict[str, Any], reported: str
) -> None:
    """A typo must not silently leave the default (127.0.0.1:6379) in force."""
    settings.RLOCKS = {"default": params}
    with pytest.raises(SystemCheckError) as caught:
        run_check()
    assert "django_rlock.E007" in str(caught.value) and reported in str(caught.value)


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-ttl", "allkeys-random"])
def test_deploy_check_warns_on_an_evicting_maxmemory_policy(r: redis.Redis, policy: str) -> None:
    r.config_set("maxmemory-policy", policy)
    try:
        report = run_check("--deploy")
    finally:
        r.config_set("maxmemory-policy", "noeviction")
    assert "django_rlock.W003" in report and policy in report


def test_deploy_check_is_quiet_on_noeviction(r: redis.Redis) -> None:
    r.config_set("maxmemory-policy", "noeviction")
    report = run_check("--deploy")
    assert "W003" not in report and "W004" not in report
    assert "W003" not in run_check()  # not a deploy run: Redis is not asked


def test_deploy_check_warns_when_redis_cannot_be_asked(settings: SettingsWrapper) -> None:
    settings.RLOCKS = {"default": {"LOCATION": f"redis://127.0.0.1:{free_port()}/0"}}
    report = run_check("--deploy")
    assert "django_rlock.W004" in report


@pytest.fixture
def user_without_config(
    r: redis.Redis, redis_url: str, settings: SettingsWrapper
) -> Iterator[redis.Redis]:
    """RLOCKS['default'] logs in as an ACL user refused CONFIG (as on managed services).

    Yields an admin client of the same server.
    """
    r.execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", "noconfig", "reset", "on", ">pw", "~*", "&*", "+@all", "-config"
    )
    location = redis_url.replace("redis://", "redis://noconfig:pw@", 1)
    settings.RLOCKS = {"default": {"LOCATION": location}}
    try:
        yield r
    finally:
        r.config_set("maxmemory-policy", "noeviction")
        r.execute_command("ACL", "DELUSER", "noconfig")  # type: ignore[no-untyped-call]


def test_deploy_check_reads_the_policy_from_info_where_config_is_refused(
    user_without_config: redis.Redis,
) -> None:
    user_without_config.config_set("maxmemory-policy", "volatile-lru")
    report = run_check("--deploy")
    assert "django_rlock.W003" in report and "volatile-lru" in report
    assert "W004" not in report
    user_without_config.config_set("maxmemory-policy", "noeviction")
    assert "no issues" in run_check("--deploy")


def test_deploy_check_says_could_not_read_when_info_is_refused_too(
    user_without_config: redis.Redis,
) -> None:
    user_without_config.execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", "noconfig", "-info"
    )
    report = run_check("--deploy")
    assert "django_rlock.W004" in report and "NoPermissionError" in report
