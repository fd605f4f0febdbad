"""``manage.py rlock inspect``: waiters, and who waits for whom (the deadlock detector's edges)."""

from __future__ import annotations

import io
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import redis
from django.core.management import call_command
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock import locks, rlock
from django_rlock.backends._types import display_owner
from django_rlock.core._protocol.deadlocks import Edge
from django_rlock.core._protocol.names import LockKeys
from tests.children import python_module, read_answer
from tests.django.conftest import HANG
from tests.lockhash import owner_counts


def rlock_command(*args: str) -> str:
    out = io.StringIO()
    call_command("rlock", *args, stdout=out)
    return out.getvalue()


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + HANG
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not after {HANG} s"
        time.sleep(0.01)


def edge_to(r: redis.Redis, prefix: str, name: str) -> bool:
    """Whether some owner's wait edge names the lock ``name``."""
    wanted = LockKeys.build(prefix, name).hash
    for key in r.scan_iter(match=f"{prefix}:waits:*", count=1000):
        edge = Edge.decode(r.get(key))
        if edge is not None and edge.lock == wanted:
            return True
    return False


def holder_digest(r: redis.Redis, prefix: str, name: str) -> str:
    (owner,) = owner_counts(r, LockKeys.build(prefix, name).hash)
    return display_owner(owner)


@contextmanager
def held_until_done(name: str) -> Iterator[threading.Event]:
    """Lock ``name`` held on a thread of its own until the event yielded is set."""
    done, held = threading.Event(), threading.Event()

    def hold() -> None:
        with rlock(name):
            held.set()
            done.wait(HANG)

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(HANG)
    try:
        yield done
    finally:
        done.set()
        thread.join(HANG)


def test_inspect_shows_the_waiters_and_what_the_holder_waits_for(
    settings: SettingsWrapper, r: redis.Redis
) -> None:
    settings.RLOCK_DEADLOCK_TIMEOUT = 0.2
    a_held = threading.Event()

    def waiter() -> None:
        with rlock("a"):
            a_held.set()
            with rlock("b"):  # waits until the holder of b lets go
                pass

    with held_until_done("b"):
        thread = threading.Thread(target=waiter)
        thread.start()
        assert a_held.wait(HANG)
        wait_until(lambda: edge_to(r, "t", "b"), "the waiter's edge")
        waiter_digest, b_digest = holder_digest(r, "t", "a"), holder_digest(r, "t", "b")

        text = rlock_command("inspect", "b")
        assert "  waiters: 1" in text.splitlines()
        assert "waiting past the deadlock check:" in text
        assert f"    {waiter_digest} for " in text
        data = json.loads(rlock_command("inspect", "b", "--json"))
        assert data["waiters"] == 1
        assert [entry["owner"] for entry in data["waited_by"]] == [waiter_digest]
        assert data["waited_by"][0]["waiting"] >= 0
        assert data["holder_waits_for"] == [] and data["deadlock"] is False

        text = rlock_command("inspect", "a")
        assert "  waiters: 0" in text.splitlines()
        assert "its holder waits for:" in text
        assert "    lock 'b' (for " in text and f"s), held by {b_digest}: " in text
        assert f" pid {os.getpid()} " in text
        assert "deadlock" not in text
        data = json.loads(rlock_command("inspect", "a", "--json"))
        assert data["waited_by"] == [] and data["deadlock"] is False
        (step,) = data["holder_waits_for"]
        assert (step["lock"], step["owner"]) == ("b", b_digest)
        assert step["holder"]["pid"] == os.getpid() and step["waiting"] >= 0
    thread.join(HANG)
    assert not thread.is_alive()


def test_inspect_shows_a_deadlock_whose_victim_stopped(
    settings: SettingsWrapper, rlocks: dict[str, Any], redis_url: str, r: redis.Redis
) -> None:
    """A cycle seen while it stands: its victim (the member whose wait began last) died
    after writing its edge, before its next check; its lock and edge outlive it a while.

    The member in this process checks every 4 s, the child every 2 s (deadlock_member.py,
    key prefix "test"): the child's first check finds no edge of this member yet, this
    member's first finds the cycle, and it is not its victim.
    """
    settings.RLOCKS = {
        **rlocks,
        "default": {**rlocks["default"], "KEY_PREFIX": "test", "DEADLOCK_TIMEOUT": 4.0},
    }
    module = "tests.sync.deadlock_member"
    x_held = threading.Event()
    outcome: list[str] = []

    def member() -> None:
        with rlock("x"):
            x_held.set()
            with rlock("y"):  # the child holds it: freed by the force-release below
                outcome.append("granted")

    with python_module(module, redis_url, "y", "x", "2.0", stdin=True) as child:
        assert read_answer(child) == {"held": True}
        thread = threading.Thread(target=member)
        thread.start()
        try:
            assert x_held.wait(HANG)
            # This member waits (its waiter is registered) before the child begins to.
            wait_until(lambda: bool(r.zcard(LockKeys.build("test", "y").waiters)), "a waiter")
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
            wait_until(lambda: edge_to(r, "test", "x"), "the child's edge")
            child.kill()  # before its next check: its lock and its edge stay a while
            wait_until(lambda: edge_to(r, "test", "y"), "this member's edge")
            mine = holder_digest(r, "test", "x")
            data = json.loads(rlock_command("inspect", "x", "--json"))
            text = rlock_command("inspect", "x")
        finally:
            locks["default"].force_release("y")
            thread.join(HANG)
    assert outcome == ["granted"]
    assert data["deadlock"] is True
    assert [step["lock"] for step in data["holder_waits_for"]] == ["y", "x"]
    assert data["holder_waits_for"][0]["holder"]["pid"] == child.pid
    assert data["holder_waits_for"][1]["owner"] == mine
    assert [entry["owner"] for entry in data["waited_by"]] != [mine]  # the child waits for x
    assert len(data["waited_by"]) == 1
    assert "lock 'x' (for " in text and "s, this lock), held by " in text
    assert "deadlock: the holder waits, through these locks, for itself" in text
