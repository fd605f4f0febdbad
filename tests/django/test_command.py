"""manage.py rlock list / inspect / release, on held and free locks."""

from __future__ import annotations

import io
import json

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError

from django_rlock import locks
from tests.django.conftest import Holders


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
    assert listing[0].split() == ["NAME", "HOLDERS", "HOLDS", "TTL", "TOKEN"]
    assert [line.split()[0] for line in listing[1:]] == ["order:1", "order:2"]
    holds, _ttl, token = listing[1].split()[2:]
    assert holds == "1" and int(token) >= 1
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


def test_owner_ids_are_never_printed(hold_elsewhere: Holders, r: redis.Redis) -> None:
    hold_elsewhere("secret")
    (owner,) = r.hgetall("t:{secret}")
    owner_id = owner.decode() if isinstance(owner, bytes) else owner
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
