"""manage.py rlock list / inspect / release, on held and free locks."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError

from django_rlock import locks
from django_rlock.exceptions import LockTimeout
from tests.django.conftest import Holders
from tests.lockhash import owner_counts

ROOT = Path(__file__).resolve().parents[2]


def rlock_command(*args: str) -> str:
    out = io.StringIO()
    call_command("rlock", *args, stdout=out)
    return out.getvalue()


@pytest.mark.parametrize("alias", ["default", "mem"])
def test_list_and_inspect_held_and_free_locks(hold_elsewhere: Holders, alias: str) -> None:
    assert "No held locks match '*'" in rlock_command("list", "--using", alias)
    hold_elsewhere("order:1", using=alias, lease=30)
    hold_elsewhere("order:2", using=alias, lease=None)
    hold_elsewhere("user:{9}", using=alias, lease=30)
    listing = rlock_command("list", "order:*", "--using", alias).splitlines()
    assert listing[0].split() == ["NAME", "HOLDER", "HELD", "FOR", "HOLDS", "TTL", "TOKEN"]
    assert [line.split()[0] for line in listing[1:]] == ["order:1", "order:2"]
    assert f"{socket.gethostname()} pid {os.getpid()} thread 'Thread-" in listing[1]
    held_for, holds, _ttl, token = listing[1].split()[-4:]
    assert holds == "1" and int(token) >= 1
    assert held_for.endswith("s") and 0 <= float(held_for[:-1]) < 60
    data = json.loads(rlock_command("list", "--json", "--using", alias))
    assert [entry["name"] for entry in data] == ["order:1", "order:2", "user:{9}"]
    assert all(entry["holds"] == 1 and entry["token"] >= 1 for entry in data)
    assert all(0 < entry["ttl"] <= 30 for entry in data)
    inspected = rlock_command("inspect", "user:{9}", "--using", alias)
    assert "Lock 'user:{9}' is held." in inspected and "(1 hold)" in inspected
    assert "Lock 'free' is free." in rlock_command("inspect", "free", "--using", alias)
    assert json.loads(rlock_command("inspect", "free", "--json", "--using", alias)) == {
        "name": "free",
        "held": False,
    }


def test_inspect_says_who_holds_it_and_since_when(hold_elsewhere: Holders) -> None:
    before = datetime.now(UTC)
    hold_elsewhere("who:1", lease=30)
    data = json.loads(rlock_command("inspect", "who:1", "--json"))
    holder = data["holder"]
    assert sorted(holder) == ["acquired_at", "host", "pid", "task_id", "task_name", "thread"]
    assert (holder["host"], holder["pid"]) == (socket.gethostname(), os.getpid())
    assert holder["thread"].startswith("Thread-")  # the holding thread, not this one
    assert holder["task_id"] is None and holder["task_name"] is None
    acquired_at = datetime.fromisoformat(holder["acquired_at"])
    assert before - timedelta(seconds=2) <= acquired_at <= datetime.now(UTC) + timedelta(seconds=2)
    assert data["waiters"] == 0
    text = rlock_command("inspect", "who:1")
    assert f"holder: {socket.gethostname()} pid {os.getpid()} thread 'Thread-" in text
    assert "(held for " in text
    assert "(a fixed 30s lease: it ends then)" in text and data["lease"] == 30


def test_inspect_says_a_watchdog_ttl_is_no_end(hold_elsewhere: Holders) -> None:
    hold_elsewhere("who:2", lease=None)
    assert "(renewed by its holder's watchdog until released)" in rlock_command("inspect", "who:2")
    assert json.loads(rlock_command("inspect", "who:2", "--json"))["lease"] is None


def test_every_view_shows_the_holder_in_the_same_words(
    hold_elsewhere: Holders, monkeypatch: pytest.MonkeyPatch
) -> None:
    """list, inspect, the release prompt and a busy lock's error name the holder alike."""
    hold_elsewhere("same:1", lease=None)
    info = locks["default"].inspect("same:1")
    assert info is not None
    words = info.holder_text()
    assert words.startswith(f"{socket.gethostname()} pid {os.getpid()} thread 'Thread-")
    assert words in rlock_command("list", "same:*")
    assert f"holder: {words}" in rlock_command("inspect", "same:1")
    # The release prompt names the holder as the list does (it showed an owner-id digest).
    prompt = io.StringIO()
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    with pytest.raises(CommandError, match="Not released"):
        call_command("rlock", "release", "same:1", "--force", stdout=prompt)
    assert f"(held by {words})?" in prompt.getvalue()
    with pytest.raises(LockTimeout) as busy, locks["default"].lock("same:1", timeout=0.05):
        pass
    assert f"held by {words}, whose watchdog renews it" in str(busy.value)


def test_held_for_is_counted_by_the_lock_servers_clock(hold_elsewhere: Holders) -> None:
    hold_elsewhere("clock:1", lease=30)
    info = locks["default"].inspect("clock:1")
    assert info is not None and info.read_at is not None
    # The server's own clock read with the hold: the same clock as '~since'.
    assert abs((info.read_at - datetime.now(UTC)).total_seconds()) < 60
    held_for = info.held_for()
    assert held_for is not None and 0 <= held_for < 60


def test_owner_ids_are_never_printed(hold_elsewhere: Holders, r: redis.Redis) -> None:
    hold_elsewhere("secret")
    (owner_id,) = owner_counts(r, "t:{secret}")
    process_id = owner_id.rsplit(":", 1)[0]
    output = rlock_command("list") + rlock_command("inspect", "secret", "--json")
    assert process_id not in output


def test_release_needs_force_and_confirmation(
    hold_elsewhere: Holders, monkeypatch: pytest.MonkeyPatch
) -> None:
    hold_elsewhere("stuck")
    lock = locks["default"].lock("stuck")
    with pytest.raises(CommandError, match="pass --force"):
        rlock_command("release", "stuck")
    monkeypatch.setattr("sys.stdin", io.StringIO("n\n"))
    with pytest.raises(CommandError, match="Not released"):
        rlock_command("release", "stuck", "--force")
    assert lock.locked()
    with pytest.raises(CommandError, match="add --yes"):
        rlock_command("release", "stuck", "--force", "--json")
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    assert "Released lock 'stuck'" in rlock_command("release", "stuck", "--force")
    assert not lock.locked()
    assert "was not held" in rlock_command("release", "stuck", "--force", "--yes")
    hold_elsewhere("stuck2", using="mem")
    released = rlock_command("release", "stuck2", "--force", "--yes", "--json", "--using", "mem")
    assert json.loads(released) == {"name": "stuck2", "released": True}


def test_bad_alias_and_name_are_command_errors() -> None:
    with pytest.raises(CommandError, match="'nope' is not in RLOCKS"):
        rlock_command("list", "--using", "nope")
    with pytest.raises(CommandError, match="control characters"):
        rlock_command("inspect", "bad\nname")


STANDARD_OPTIONS = ("-v", "2", "--no-color", "--traceback", "--skip-checks")


@pytest.mark.parametrize("before_action", [True, False])
def test_django_standard_options_are_accepted_before_and_after_the_action(
    hold_elsewhere: Holders, before_action: bool
) -> None:
    hold_elsewhere("order:7")
    out = io.StringIO()
    action = ("list", "--using", "default", "--json")
    args = (*STANDARD_OPTIONS, *action) if before_action else (*action, *STANDARD_OPTIONS)
    call_command("rlock", *args, stdout=out)
    assert [entry["name"] for entry in json.loads(out.getvalue())] == ["order:7"]


def run_manage(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django", "rlock", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ""},
    )


def test_settings_and_pythonpath_work_in_a_real_process(
    hold_elsewhere: Holders, redis_url: str, tmp_path: Path
) -> None:
    hold_elsewhere("order:8")
    (tmp_path / "cli_settings.py").write_text(
        "SECRET_KEY = 'x'\n"
        "INSTALLED_APPS = ['django_rlock']\n"
        f"RLOCKS = {{'default': {{'LOCATION': {redis_url!r}, 'KEY_PREFIX': 't'}}}}\n"
    )
    for options in (
        ("list", "--json", f"--pythonpath={tmp_path}", "--settings=cli_settings", "-v", "2"),
        (f"--pythonpath={tmp_path}", "--settings=cli_settings", "--no-color", "list", "--json"),
    ):
        result = run_manage(*options)
        assert result.returncode == 0, result.stderr
        assert [entry["name"] for entry in json.loads(result.stdout)] == ["order:8"]


def test_traceback_option_is_honoured_in_a_real_process() -> None:
    """tests/django_settings.py points ``default`` at port 1, where nothing listens."""
    plain = run_manage("inspect", "x", "--settings=tests.django_settings")
    traced = run_manage("inspect", "x", "--traceback", "--settings=tests.django_settings")
    assert plain.returncode == traced.returncode == 1
    assert "Traceback" not in plain.stderr and "Traceback" in traced.stderr
    assert "LockUnavailableError" in traced.stderr
