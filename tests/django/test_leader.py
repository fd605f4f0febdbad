"""django_rlock.leader(): an election on an RLOCKS alias, and how operators see its leader."""

from __future__ import annotations

import asyncio
import io
import json
import os
import socket
import threading
from collections.abc import Callable

import pytest
import redis
from django.core.management import call_command
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock import LockLostError, LockTimeout, leader, locks
from django_rlock.core import Term
from django_rlock.core._process.holder import DESCRIPTION_FIELDS, read_hold
from django_rlock.exceptions import InvalidLockBackendError, InvalidLockNameError

WAIT = 10.0


def rlock_command(*args: str) -> str:
    out = io.StringIO()
    call_command("rlock", *args, stdout=out)
    return out.getvalue()


def test_the_leader_is_shown_by_rlock_list_and_inspect(r: redis.Redis) -> None:
    with leader("nightly-billing") as term:
        assert isinstance(term, Term) and term.token >= 1 and not term.lost
        listing = rlock_command("list").splitlines()
        (row,) = [line for line in listing[1:] if line.startswith("nightly-billing ")]
        assert f"{socket.gethostname()} pid {os.getpid()} thread 'MainThread (leader)'" in row
        holder = json.loads(rlock_command("inspect", "nightly-billing", "--json"))["holder"]
        assert sorted(holder) == ["acquired_at", "host", "pid", "task_id", "task_name", "thread"]
        assert holder["thread"] == "MainThread (leader)"
        info = locks["default"].inspect("nightly-billing")
        assert info is not None and info.holder_text().endswith("thread 'MainThread (leader)'")
        # A plain lock of this thread is not described as a leader.
        with locks["default"].lock("plain"):
            plain = json.loads(rlock_command("inspect", "plain", "--json"))["holder"]
            assert plain["thread"] == "MainThread"
    assert not r.exists("t:{nightly-billing}")


@pytest.mark.parametrize("alias", ["default", "mem"])
def test_a_standby_is_elected_when_the_leader_steps_down(alias: str) -> None:
    terms: list[int] = []
    elected = threading.Event()

    def stand() -> None:
        with leader("poller", using=alias) as term:
            terms.append(term.token)
            elected.set()

    with leader("poller", using=alias) as first:
        standby = threading.Thread(target=stand)
        standby.start()
        assert not elected.wait(0.3)  # standing by
        with pytest.raises(LockTimeout, match=r"not elected leader of 'poller' within 0\.1s"):
            on_another_thread(lambda: leader("poller", using=alias, timeout=0.1).__enter__())
    standby.join(WAIT)
    assert terms and terms[0] > first.token


def on_another_thread(call: Callable[[], object]) -> None:
    """Run ``call`` on a thread of its own (another candidate), raising what it raised."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as error:  # noqa: BLE001 -- handed to the test thread
            errors.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(WAIT)
    if errors:
        raise errors[0]


def test_a_lost_term_is_told_and_left_quietly(r: redis.Redis) -> None:
    told = threading.Event()
    with leader("reaper") as term:
        term.on_lost(lambda _term: told.set())
        assert locks["default"].force_release("reaper")
        assert told.wait(WAIT)
        assert term.lost
    with leader("reaper") as again:
        assert not again.lost and again.token > term.token


def test_async_with_elects_the_task(r: redis.Redis) -> None:
    async def scenario() -> tuple[int, int]:
        election = leader("feed-poller")
        async with election as first:
            assert not first.lost
            holder = read_hold(*r.hmget("t:{feed-poller}", DESCRIPTION_FIELDS)) or {}
            assert str(holder["thread"]).endswith(" (leader)")
        async with election as second:
            return first.token, second.token

    first, second = asyncio.run(scenario())
    assert second > first
    assert not r.exists("t:{feed-poller}")


def test_bad_arguments_are_clear_errors(settings: SettingsWrapper, redis_url: str) -> None:
    with pytest.raises(InvalidLockNameError):
        leader("")
    with pytest.raises(InvalidLockBackendError):
        leader("x", using="nope")
    with pytest.raises(ValueError, match="timeout"):
        leader("x", timeout=-1)
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "shop": {"BACKEND": "django_rlock.cache.RedisCache", "LOCATION": redis_url},
    }
    settings.RLOCKS = {"default": {"CACHE": "shop"}}

    async def in_async_code() -> None:
        async with leader("cached"):
            pass

    with pytest.raises(NotImplementedError, match="needs the asyncio engine"):
        asyncio.run(in_async_code())


def test_an_alias_max_hold_bounds_locks_but_not_terms(settings: SettingsWrapper) -> None:
    settings.RLOCKS = {**settings.RLOCKS}
    settings.RLOCKS["default"] = {
        **settings.RLOCKS["default"],
        "WATCHDOG_TIMEOUT": 1,
        "MAX_HOLD": 0.4,
    }
    work = locks["default"].lock("work")
    plain_lost = threading.Event()
    work.on_lost(lambda _lock: plain_lost.set())

    async def async_term() -> bool:
        async with leader("async-office") as term:
            await asyncio.sleep(1.2)
            return term.lost

    with leader("office") as term:
        with pytest.raises(LockLostError), work:
            assert plain_lost.wait(WAIT)  # a hold past MAX_HOLD is lost...
        held_past_it = asyncio.run(async_term())
        assert not term.lost  # ...a term is not
    assert not held_past_it
