"""A rolling upgrade: processes of the previous release and of this one share a lock.

The previous release registers waiters with no wake name and publishes every
release on the lock's shared channel; this one publishes on the woken waiter's
wake channel (tests/sync/test_wake_channels.py). Mixed, they must still
exclude each other and wake each other, in both directions, well before the
holder's PTTL (the 30 s watchdog timeout) would wake a waiter anyway.

The previous release runs in its own virtualenv, whose interpreter
``RLOCK_PREVIOUS_PYTHON`` names (the test is skipped without it). To make one
from a clone, at the previous release's commit::

    git archive <commit> | tar -x -C /tmp/previous
    python3 -m venv /tmp/previous/venv
    /tmp/previous/venv/bin/pip install build
    /tmp/previous/venv/bin/python -m build --wheel --outdir /tmp/previous/dist /tmp/previous
    /tmp/previous/venv/bin/pip install /tmp/previous/dist/*.whl
    export RLOCK_PREVIOUS_PYTHON=/tmp/previous/venv/bin/python
    make test PYTEST_ARGS=tests/sync/test_rolling_upgrade.py
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from django_rlock.core import LockClient
from django_rlock.core._process.holder import holder_details
from tests.children import child, read_answer

PREVIOUS = os.environ.get("RLOCK_PREVIOUS_PYTHON", "")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not PREVIOUS, reason="RLOCK_PREVIOUS_PYTHON names no previous release"),
]

#: Generous bounds for a loaded machine, far below the 30 s a lost wake-up costs.
WOKEN = 10.0
REGISTER = 20.0


@contextmanager
def previous_release(
    url: str, cwd: Path, python: str = PREVIOUS
) -> Iterator[subprocess.Popen[str]]:
    """tests/sync/upgrade_peer.py run by the previous release's interpreter, isolated.

    ``-I`` and a ``cwd`` outside the source tree: it imports its own installed
    package, never this tree's. ``python``: this release's, for a peer of ours.
    """
    script = Path(__file__).with_name("upgrade_peer.py")
    with child([python, "-I", str(script), url], stdin=True, cwd=cwd) as process:
        yield process


def tell(process: subprocess.Popen[str], line: str) -> dict[str, Any]:
    assert process.stdin is not None
    process.stdin.write(line + "\n")
    process.stdin.flush()
    return read_answer(process)


def registered(r: redis.Redis, name: str) -> bytes:
    """The first waiter id registered on ``name``, once there is one."""
    deadline = time.monotonic() + REGISTER
    while not (first := cast("list[bytes]", r.zrange(f"test:{{{name}}}:waiters", 0, 0))):
        assert time.monotonic() < deadline, f"no waiter registered on {name}"
        time.sleep(0.005)
    return first[0]


def test_a_waiter_of_the_previous_release_is_woken_by_ours(
    r: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    with (
        LockClient(redis_url, key_prefix="test") as client,
        previous_release(redis_url, tmp_path) as old,
    ):
        lock = client.lock("upgrade-a")
        assert lock.acquire()
        assert tell(old, "try upgrade-a") == {"got": False}
        assert tell(old, "wait upgrade-a") == {"waiting": True}
        assert not registered(r, "upgrade-a").startswith(b"@")  # no wake name: the old id
        released_at = time.monotonic()
        lock.release()
        reply = read_answer(old)
        assert reply["granted"] is True
        assert reply["at"] - released_at < WOKEN, "the old waiter slept out the PTTL"
        assert not lock.acquire(blocking=False)  # the old process holds it
        tell(old, "release")
        assert lock.acquire(blocking=False)
        lock.release()


def test_our_waiter_is_woken_by_a_release_of_the_previous_release(
    r: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    with (
        LockClient(redis_url, key_prefix="test") as client,
        previous_release(redis_url, tmp_path) as old,
    ):
        lock = client.lock("upgrade-b")
        assert tell(old, "hold upgrade-b") == {"held": True}
        assert not lock.acquire(blocking=False)
        granted_at: list[float] = []
        granted, give_back = threading.Event(), threading.Event()

        def wait() -> None:
            # Each thread is its own owner: this one holds what it is granted.
            if lock.acquire(timeout=60):
                granted_at.append(time.monotonic())
                granted.set()
                give_back.wait(60)
                lock.release()

        thread = threading.Thread(target=wait)
        thread.start()
        try:
            assert registered(r, "upgrade-b").startswith(b"@")  # ours, with a wake name
            released_at = tell(old, "release")["released_at"]
            assert granted.wait(60), "our waiter was never granted"
            assert granted_at[0] - released_at < WOKEN, "our waiter slept out the PTTL"
            assert tell(old, "try upgrade-b") == {"got": False}  # we hold it
        finally:
            give_back.set()
            thread.join(60)
        assert tell(old, "try upgrade-b") == {"got": True}


def test_old_and_new_processes_contending_lose_no_update(
    r: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    # Two processes of each release take one lock in turns, each adding to a
    # counter by a GET and a SET: an overlap loses an update. Ours hand the
    # lock over to their starving waiters; the old ones wake theirs.
    times = 150
    with ExitStack() as stack:
        peers = [
            stack.enter_context(previous_release(redis_url, tmp_path, python))
            for python in (PREVIOUS, PREVIOUS, sys.executable, sys.executable)
        ]
        for peer in peers:
            assert peer.stdin is not None
            peer.stdin.write(f"count mixed {times}\n")
            peer.stdin.flush()
        for peer in peers:
            assert read_answer(peer) == {"counted": times}
    assert int(r.get("test:count:mixed") or 0) == times * len(peers)


def test_each_release_describes_the_others_holder_as_the_changelog_says(
    r: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    # This release stores the description compactly (~holder, ~task), the
    # previous one as JSON in ~holder: ours reads both; the previous release
    # reads ours as no description ("an unknown holder"), never a wrong one.
    with (
        LockClient(redis_url, key_prefix="test") as client,
        previous_release(redis_url, tmp_path) as old,
    ):
        assert tell(old, "hold upgrade-d") == {"held": True}
        seen = client.lock("upgrade-d").holder()
        assert seen is not None
        assert (seen["host"], seen["pid"], seen["thread"]) == (
            socket.gethostname(),
            old.pid,
            "MainThread",
        )
        assert seen["acquired_at"] is not None and seen["lease"] is None
        tell(old, "release")
        lock = client.lock("upgrade-e")
        with holder_details(task_id="5f2b9c3e-8a41-4d7e-9b0c-2e6f1a7d4c58", task_name="t.charge"):
            assert lock.acquire()
        try:
            # Compact: a listpack (a ziplist before Redis 7).
            assert r.object("encoding", "test:{upgrade-e}") in (b"listpack", b"ziplist")
            assert tell(old, "holder upgrade-e") == {"holder": None}
            assert tell(old, "try upgrade-e") == {"got": False}  # still excluded
        finally:
            lock.release()
