"""The holder a grant describes: a thread's description, kept per thread, names its own process."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import cast

import pytest
import redis

from django_rlock.core import LockClient
from django_rlock.core._process import holder
from django_rlock.core._process.holder import describe, holder_details, read_hold


@pytest.mark.pure
def test_a_forked_child_describes_itself_with_its_own_pid() -> None:
    # The thread keeps its description from call to call; a child forked by it
    # inherits that thread's copy, which names the parent.
    assert (read_hold(describe(), None) or {}).get("pid") == os.getpid()
    child = os.fork()
    if child == 0:  # the child: exit status 0 when its description names it
        code = 1
        try:
            code = 0 if (read_hold(describe(), None) or {}).get("pid") == os.getpid() else 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0, "the child described its parent"
            return
        time.sleep(0.01)
    os.kill(child, 9)
    pytest.fail("the forked child did not finish")


# -- How a description is stored: each value at most 64 bytes (issue 32) -------
#
# Redis keeps a hash as a listpack (~216 B for a held lock) only while every
# value is at most hash-max-listpack-value (64 B by default); one longer value
# makes it a hash table (~550 B) for the rest of its life. The description used
# to be one JSON field, over 64 B for any Celery task and most cloud host names.

#: A hash's compact encoding: listpack on Redis 7, ziplist before (6.2, the oldest line).
COMPACT = (b"listpack", b"ziplist")

#: A realistic long host, a Celery task's id and name.
LONG_HOST = "ip-10-0-12-34.eu-west-1.compute.internal"
TASK_ID = "5f2b9c3e-8a41-4d7e-9b0c-2e6f1a7d4c58"
TASK_NAME = "shop.billing.tasks.charge_customer_invoice"


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """``host(name)``: describe this process as running on ``name`` (descriptions made again)."""

    def use(name: str) -> None:
        monkeypatch.setattr(holder, "_HOST", name)
        holder._encoded.cache_clear()
        holder._made.plain = None

    yield use
    holder._encoded.cache_clear()
    holder._made.plain = None


def _hashes(r: redis.Redis) -> dict[str, dict[str, bytes]]:
    found: dict[str, dict[str, bytes]] = {}
    for key in r.scan_iter(count=1000):
        if r.type(key) == b"hash":
            fields = cast("dict[bytes, bytes]", r.hgetall(key))
            found[key.decode()] = {k.decode(): v for k, v in fields.items()}
    return found


def _held_by_a_task(lock_client: LockClient, kind: str) -> Iterator[None]:
    with holder_details(task_id=TASK_ID, task_name=TASK_NAME):
        if kind == "lock":
            with lock_client.lock("listpack"):
                yield
        elif kind == "fair":
            with lock_client.fair_lock("listpack"):
                yield
        elif kind == "read":
            with lock_client.read_write_lock("listpack").read:
                yield
        elif kind == "write":
            with lock_client.read_write_lock("listpack").write:
                yield
        elif kind == "semaphore":
            with lock_client.semaphore("listpack", 2):
                yield
        else:
            java = LockClient(lock_client.redis, key_prefix="test", layout="redisson")
            with java, java.lock("listpack"):
                yield


KINDS = ("lock", "fair", "read", "write", "semaphore", "redisson")


@pytest.mark.parametrize("kind", KINDS)
def test_a_celery_tasks_hold_on_a_long_host_keeps_its_hash_a_listpack(
    r: redis.Redis, lock_client: LockClient, host: Callable[[str], None], kind: str
) -> None:
    host(LONG_HOST)
    for _ in _held_by_a_task(lock_client, kind):
        described = {key: f for key, f in _hashes(r).items() if "~holder" in f}
        assert described, "no hash describes the holder"
        for key, fields in described.items():
            assert r.object("encoding", key) in COMPACT, (key, fields)
            assert max(len(value) for value in fields.values()) <= holder.MAX_VALUE_BYTES
            seen = holder.read_holder({f: v.decode() for f, v in fields.items()})
            assert seen is not None
            assert (seen["host"], seen["pid"], seen["thread"]) == (
                LONG_HOST,
                os.getpid(),
                threading.current_thread().name,
            )
            assert seen["task_id"] == TASK_ID
            # Cut to fit beside the id: its end, the task's own name, is kept.
            assert seen["task_name"].startswith(holder.CUT_MARK)
            assert TASK_NAME.endswith(seen["task_name"][1:]) and len(seen["task_name"]) > 20


@pytest.mark.parametrize("lease", [None, 7.25])
@pytest.mark.parametrize("kind", ["lock", "fair", "redisson"])
def test_holder_reads_back_what_the_grant_was_described_with(
    lock_client: LockClient, host: Callable[[str], None], kind: str, lease: float | None
) -> None:
    host("ip-10-0-12-34.ec2.internal")
    if kind == "redisson":
        client = LockClient(lock_client.redis, key_prefix="test", layout="redisson")
        lock = client.lock("round-trip")
    else:
        client = lock_client
        lock = (
            lock_client.fair_lock("round-trip")
            if kind == "fair"
            else lock_client.lock("round-trip")
        )
    with holder_details(task_id=TASK_ID, task_name="shop.tasks.charge"):
        assert lock.acquire(lease=lease)
    try:
        seen = lock.holder()
    finally:
        lock.release()
        if client is not lock_client:
            client.close()
    assert seen is not None and set(seen) == {*holder.HOLDER_KEYS, holder.LEASE_KEY}
    assert {key: seen[key] for key in ("host", "pid", "thread", "task_id", "task_name")} == {
        "host": "ip-10-0-12-34.ec2.internal",
        "pid": os.getpid(),
        "thread": threading.current_thread().name,
        "task_id": TASK_ID,
        "task_name": "shop.tasks.charge",
    }
    assert seen["lease"] == lease
    assert seen["acquired_at"] is not None


def test_a_redisson_layout_grant_leaves_no_task_of_an_earlier_holder(
    r: redis.Redis, lock_client: LockClient
) -> None:
    # The Redisson layout keeps the description in a hash of its own, which a
    # grant may find still there: the Java side frees the lock (forceUnlock,
    # or its own unlock after our hold expired) without touching it.
    python = LockClient(lock_client.redis, key_prefix="test", layout="redisson")
    with python:
        lock = python.lock("stale")
        with holder_details(task_id=TASK_ID, task_name=TASK_NAME):
            assert lock.acquire()
        r.delete(lock.keys.hash)  # freed by Java, our description hash left
        assert lock.acquire()  # by this thread, outside any task: a new grant
        try:
            seen = lock.holder()
        finally:
            lock.release()
    assert seen is not None and seen["pid"] == os.getpid()
    assert (seen["task_id"], seen["task_name"]) == (None, None)


def test_long_and_non_ascii_names_are_cut_to_fit_and_read_back_cut(
    r: redis.Redis, lock_client: LockClient, host: Callable[[str], None]
) -> None:
    host("hôte-numéro-" * 8)
    lock = lock_client.lock("cut")
    with holder_details(task_id="not-a-uuid-" * 2, task_name="tâche." * 20, role="leader"):
        assert lock.acquire(lease=3.5)
    try:
        fields = r.hgetall("test:{cut}")
        seen = lock.holder()
    finally:
        lock.release()
    assert r.object("encoding", "test:{cut}") is None  # released: gone
    assert all(len(value) <= holder.MAX_VALUE_BYTES for value in fields.values())
    assert seen is not None and seen["pid"] == os.getpid() and seen["lease"] == 3.5
    assert seen["host"].endswith(holder.CUT_MARK) and ("hôte-numéro-" * 8).startswith(
        seen["host"][:-1]
    )
    assert seen["thread"] == f"{threading.current_thread().name} (leader)"
    # The task id is never cut (Celery's duplicate check compares it whole): the name gives way.
    assert seen["task_id"] == "not-a-uuid-" * 2
    assert seen["task_name"].startswith(holder.CUT_MARK) and ("tâche." * 20).endswith(
        seen["task_name"][1:]
    )


def test_a_grant_of_the_previous_release_is_described_as_before(
    r: redis.Redis, lock_client: LockClient
) -> None:
    # The hash the previous release's grant leaves: the whole description, JSON, as '~holder'.
    old = {
        "host": "web-1",
        "pid": 4242,
        "thread": "Thread-3",
        "task_id": TASK_ID,
        "task_name": TASK_NAME,
        "role": "leader",
        "lease": 12.5,
    }
    r.hset(
        "test:{old}",
        mapping={
            "0123abcd:1": 1,
            "~t": "17",
            "~r": "",
            "~holder": json.dumps(old, separators=(",", ":")),
            "~since": "1700000000000",
        },
    )
    r.pexpire("test:{old}", 30_000)
    seen = lock_client.lock("old").holder()
    assert seen == {
        "host": "web-1",
        "pid": 4242,
        "thread": "Thread-3 (leader)",
        "task_id": TASK_ID,
        "task_name": TASK_NAME,
        "acquired_at": "2023-11-14T22:13:20+00:00",
        "lease": 12.5,
    }
    assert (
        holder.holder_line(seen)
        == f"web-1 pid 4242 thread 'Thread-3 (leader)' task {TASK_NAME}[{TASK_ID}]"
    )


@pytest.mark.pure
def test_every_stored_part_fits_whatever_the_names() -> None:
    for name in ("", "x", "é" * 100, "\U0001f512" * 40, "a\x1fb\x1ec\x1dd" * 20):
        for task_id in ("", TASK_ID, TASK_ID.upper(), name):
            with holder_details(task_id=task_id, task_name=name, role=name[:30]):
                sent = holder.describe(lease=123456.789012345)
            parts = sent.split(holder.TASK_MARK)
            assert 1 <= len(parts) <= 2
            assert len(parts[0].encode()) <= holder.MAX_VALUE_BYTES, parts
            if len(parts) == 2:
                # The task id is never cut (Celery's duplicate check compares it
                # whole): only an id too long to fit leaves the part longer.
                stored_id = holder.stored_task_id(task_id)
                assert parts[1].startswith(stored_id)
                limit = max(holder.MAX_VALUE_BYTES, len(stored_id.encode()))
                assert len(parts[1].encode()) <= limit, parts
            seen = holder.read_hold(*[parts[0], "1", parts[1] if len(parts) == 2 else None])
            assert (
                seen is not None
                and seen["pid"] == os.getpid()
                and seen["lease"] == 123456.789012345
            )
            if task_id and not any(mark in task_id for mark in "\x1c\x1d\x1e\x1f"):
                assert seen["task_id"] == task_id  # whole, however long
            # A previous release's script (a fair lock handed on by it) stores it whole.
            assert holder.read_hold(sent, "1") == seen
