"""The scripts composed from core/_protocol/lua.py: filled, loadable, and within the ACL list."""

from __future__ import annotations

import re

import pytest
import redis

from django_rlock.core._protocol import catalog
from django_rlock.core._protocol.lock import SCRIPT_COMMANDS
from django_rlock.core._protocol.lua import register_waiter, release_hold, report_or_reenter

#: Every script a lock kind sends, by name.
SCRIPTS = catalog.scripts()


@pytest.mark.pure
def test_every_kind_s_scripts_are_found() -> None:
    assert {"lock.acquire", "fairlock.release", "rwlock.read_acquire",
            "semaphore.release"} <= set(SCRIPTS)  # fmt: skip


@pytest.mark.pure
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_no_placeholder_is_left_unfilled(name: str) -> None:
    # The snippets' fields are string.Template's ($latch, ${handoff}, ...), and
    # Lua never writes a `$`; nor does it name anything but KEYS and ARGV in
    # capitals (the placeholder words the snippets once had: KEYS[LATCH], ...).
    fields = sorted(set(re.findall(r"\$(?:\{\w*\}?|\w*)", SCRIPTS[name])))
    assert not fields, f"{name} still holds {fields}"
    words = set(re.findall(r"\b[A-Z][A-Z_]{2,}\b", SCRIPTS[name])) - {"KEYS", "ARGV"}
    assert not words, f"{name} still holds {sorted(words)}"


@pytest.mark.pure
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_command_is_in_the_minimal_acl(name: str) -> None:
    called = {
        f"{command}|{sub}" if sub else command
        for command, sub in re.findall(r"redis\.p?call\('([a-z]+)'(?:, '(numsub)')?", SCRIPTS[name])
    }
    assert called, name
    assert called <= set(SCRIPT_COMMANDS), f"{name} runs {sorted(called - set(SCRIPT_COMMANDS))}"


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_script_compiles_on_the_server(name: str, r: redis.Redis) -> None:
    digest = r.script_load(SCRIPTS[name])
    assert r.script_exists(digest) == [True]


@pytest.mark.pure
def test_the_snippet_functions_fill_the_keys_they_are_given() -> None:
    reentry = report_or_reenter(latch="7", token="0", fence=None)
    assert "KEYS[7]" in reentry and "pexpire', nil" not in reentry
    assert "redis.call('pexpire', KEYS[9], ttl)" in report_or_reenter(
        latch="7", token="0", fence="KEYS[9]"
    )
    registration = register_waiter(waiters="KEYS[8]", wait="soonest")
    assert "zadd', KEYS[8]" in registration and registration.rstrip().endswith("return soonest")
    assert "hincrby', KEYS[2], ARGV[1], -1" in release_hold(hold="KEYS[2]", latch="5")
