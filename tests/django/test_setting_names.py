"""Misspelt settings are refused by the checks, with the close match (``django_rlock.E007``).

An unknown ``RLOCK_*`` global used to be ignored in silence, leaving the
default in force (``RLOCK_WATCHDOG_TIMOUT``), and ``RLOCK = {...}`` for
``RLOCKS`` left every lock on the default Redis at 127.0.0.1:6379.
"""

from __future__ import annotations

import re
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock import _conf as conf


def run_check() -> str:
    out, err = StringIO(), StringIO()
    call_command("check", "--tag", "django_rlock", stdout=out, stderr=err)
    return out.getvalue() + err.getvalue()


@pytest.mark.parametrize(
    ("setting", "suggested"),
    [
        ("RLOCK_WATCHDOG_TIMOUT", "RLOCK_WATCHDOG_TIMEOUT"),
        ("RLOCK_SLOW_HOLDS", "RLOCK_SLOW_HOLD"),
        ("RLOCK_BUSY_RESPONCE", "RLOCK_BUSY_RESPONSE"),
        ("RLOCK_METRIC", "RLOCK_METRICS"),
        ("RLOCK_S", "RLOCKS"),
    ],
)
def test_an_unknown_rlock_global_is_refused_with_the_close_match(
    settings: SettingsWrapper, setting: str, suggested: str
) -> None:
    setattr(settings, setting, 10)
    with pytest.raises(SystemCheckError) as caught:
        run_check()
    report = str(caught.value)
    assert "django_rlock.E007" in report
    assert f"{setting} is not a django-rlock setting (did you mean {suggested!r}?)" in report


def test_an_alias_only_key_as_a_global_says_where_it_goes(settings: SettingsWrapper) -> None:
    settings.RLOCK_LOCATION = "redis://127.0.0.1:6379/0"
    with pytest.raises(SystemCheckError, match=r"LOCATION exists only inside an alias"):
        run_check()


@pytest.mark.parametrize("setting", ["RLOCK", "RLOCS", "RLOKS", "R_LOCKS"])
@pytest.mark.parametrize("shape", ["aliases", "one alias"])
def test_a_dict_spelt_like_rlocks_is_refused(
    settings: SettingsWrapper, rlocks: dict[str, Any], setting: str, shape: str
) -> None:
    alias = rlocks["default"]
    setattr(settings, setting, {"default": alias} if shape == "aliases" else alias)
    del settings.RLOCKS
    with pytest.raises(SystemCheckError) as caught:
        run_check()
    report = str(caught.value)
    assert f"{setting} is not a django-rlock setting (did you mean 'RLOCKS'?)" in report
    assert "which is not set: every lock uses the default Redis at redis://127.0.0.1" in report


def test_beside_rlocks_the_misspelling_is_still_refused(
    settings: SettingsWrapper, rlocks: dict[str, Any]
) -> None:
    settings.RLOCK = {"reports": rlocks["default"]}
    with pytest.raises(SystemCheckError, match=r"RLOCK is not a django-rlock setting") as caught:
        run_check()
    assert "which is not set" not in str(caught.value)


def test_known_settings_and_other_apps_settings_pass(
    settings: SettingsWrapper, rlocks: dict[str, Any]
) -> None:
    settings.RLOCKS = {"default": rlocks["default"]}
    settings.RLOCK_WATCHDOG_TIMEOUT = 10
    settings.RLOCK_SLOW_WAIT = None
    settings.RLOCK_LEAKED = "warn"
    settings.RLOCK_TRANSACTION = "auto"
    settings.ROCKS = {"a": 1}  # spelt like RLOCKS, but not lock settings
    settings.LOCKS = {"default": {}}  # an app's own setting: does not start like RLOCKS
    settings.RLOCKER = "on"  # close to RLOCKS but no dict of aliases
    assert "no issues" in run_check()


def test_every_global_of_the_settings_table_is_known() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "django.md").read_text()
    table = page.split("## Settings", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    documented = {name for row in rows for name in re.findall(r"`(RLOCK_[A-Z_]+)`", row)}
    assert "RLOCK_WATCHDOG_TIMEOUT" in documented
    assert documented - conf.GLOBAL_SETTINGS == set()
