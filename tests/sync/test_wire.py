"""The lean command path (_sync/wire.py): where it can fail differently from redis-py's.

A thread's acquire and release are packed by the library and sent on the
connection it holds; these tests break that path on a real redis-server (a
flushed script cache, an error reply, a connection killed between calls, a
fork, other reply decodings) and check that the outcome is what redis-py's
path gives: same exceptions, same holds.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_rlock.core import LockClient
from django_rlock.core._sync.scripts import LockScript
from django_rlock.core._sync.wire import HeldClient

HANG = 10.0  # seconds: only ever reached when something hangs


def _held_id(client: LockClient) -> int:
    held = client.held()
    assert isinstance(held, HeldClient)
    return int(held.client_id())


class Paths:
    """How many calls took each path: counts only, every call still runs for real."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.lean = 0
        self.redis_py = 0
        run_packed, call = HeldClient.run_packed, LockScript.__call__

        def counted_run_packed(held: HeldClient, packed: bytes) -> Any:
            self.lean += 1
            return run_packed(held, packed)

        def counted_call(script: LockScript, *args: Any, **kwargs: Any) -> Any:
            self.redis_py += 1
            return call(script, *args, **kwargs)

        monkeypatch.setattr(HeldClient, "run_packed", counted_run_packed)
        monkeypatch.setattr(LockScript, "__call__", counted_call)


@pytest.fixture
def paths(monkeypatch: pytest.MonkeyPatch) -> Paths:
    return Paths(monkeypatch)


def test_acquire_and_release_are_sent_on_the_lean_path(
    lock_client: LockClient, paths: Paths
) -> None:
    lock = lock_client.lock("lean")
    assert isinstance(lock_client.held(), HeldClient)
    with lock:  # the scripts loaded (a fresh server has none)
        pass
    lean, redis_py = paths.lean, paths.redis_py
    with lock, lock:
        assert lock.hold_count() == 2
    assert not lock.locked()
    assert (paths.lean - lean, paths.redis_py - redis_py) == (4, 0)


def test_a_flushed_script_cache_costs_one_reload(
    lock_client: LockClient, r: redis.Redis, paths: Paths
) -> None:
    lock = lock_client.lock("flushed")
    with lock:
        pass
    r.script_flush()
    redis_py = paths.redis_py
    with lock:  # NOSCRIPT on the lean path: redis-py's path loads and runs it
        assert lock.owned() and lock.hold_count() == 1
    assert paths.redis_py - redis_py == 2
    r.script_flush()
    assert lock.acquire(blocking=False)
    r.script_flush()  # the release is reloaded, the acquire flushed again
    lock.release()
    assert not lock.locked()
    assert paths.redis_py - redis_py == 4
    with lock:
        pass
    assert paths.redis_py - redis_py == 5
    lean = paths.lean
    with lock:  # both loaded: the lean path alone
        pass
    assert (paths.lean - lean, paths.redis_py - redis_py) == (2, 5)


@pytest.fixture
def plain_client(redis_url: str) -> Iterator[LockClient]:
    """A client whose calls take redis-py's path: a blocking pool holds no connection."""
    pool = redis.BlockingConnectionPool.from_url(redis_url, max_connections=4)
    client = LockClient(redis.Redis(connection_pool=pool), key_prefix="test")
    assert client.held() is None
    yield client
    client.close()
    pool.disconnect()


def test_an_error_reply_raises_what_redis_pys_path_raises(
    lock_client: LockClient, plain_client: LockClient, r: redis.Redis
) -> None:
    errors = []
    for client in (lock_client, plain_client):
        lock = client.lock("wrong-type")
        r.set(lock.keys.hash, "not a hash")  # the script's HEXISTS answers WRONGTYPE
        with pytest.raises(redis.ResponseError) as raised:
            lock.acquire(blocking=False)
        errors.append(raised.value)
        r.delete(lock.keys.hash)
        assert lock.acquire(blocking=False)  # the connection is still usable
        lock.release()
    lean, plain = errors
    assert type(lean) is type(plain)
    assert "WRONGTYPE" in str(lean) and "WRONGTYPE" in str(plain)


def test_a_connection_killed_between_calls_is_made_again(
    lock_client: LockClient, r: redis.Redis
) -> None:
    lock = lock_client.lock("killed")
    assert lock.acquire()
    r.client_kill_filter(_id=str(_held_id(lock_client)))
    lock.release()  # the retry policy reconnects; the request latch keeps it once
    assert not lock.locked()
    assert lock.acquire(blocking=False)
    r.client_kill_filter(_id=str(_held_id(lock_client)))
    assert lock.acquire(blocking=False)  # a re-entry, sent on a new connection
    assert lock.hold_count() == 2
    lock.release()
    lock.release()
    assert not lock.locked()


def test_without_retries_a_killed_connection_is_resent_once_and_counted_once(
    redis_url: str, r: redis.Redis
) -> None:
    pool = redis.ConnectionPool.from_url(redis_url, retry=Retry(NoBackoff(), 0))
    client = LockClient(redis.Redis(connection_pool=pool), key_prefix="test")
    try:
        lock = client.lock("no-retries")
        assert lock.acquire()
        r.client_kill_filter(_id=str(_held_id(client)))
        assert lock.acquire()  # LOST_REPLY: sent once more, with the same request id
        assert lock.hold_count() == 2
        r.client_kill_filter(_id=str(_held_id(client)))
        lock.release()
        lock.release()
        assert not lock.locked()
    finally:
        client.close()
        pool.disconnect()


def test_a_held_client_collected_inside_its_pools_lock_does_not_deadlock(
    redis_url: str, r: redis.Redis
) -> None:
    # A client left in a reference cycle (redis-py 5 leaves one after a failed
    # call) is freed by the garbage collector, which runs its __del__ in
    # whatever thread it runs: here, one holding the pool's lock, as a thread
    # making a connection does. On redis-py 5 (a plain Lock) this deadlocked.
    pool = redis.ConnectionPool.from_url(redis_url, retry=Retry(NoBackoff(), 0))
    held = HeldClient(pool)
    connection = held.connection
    assert connection is not None
    finished = threading.Event()

    def collected_inside_the_lock() -> None:
        with pool._lock:
            held.__del__()
        finished.set()

    thread = threading.Thread(target=collected_inside_the_lock, daemon=True)
    thread.start()
    try:
        assert finished.wait(HANG), "__del__ inside the pool's lock did not return"
        assert held.connection is None
        # Given back (redis-py 6 and later: the lock is reentrant), or closed
        # where it was (redis-py 5): never left open and lost to the pool.
        assert connection in pool._available_connections or connection._sock is None
        assert r.ping()
        held.__del__()  # again: nothing left to give back
    finally:
        if finished.is_set():  # else the lock is held for good: disconnecting would hang
            pool.disconnect()


def test_a_forked_child_packs_its_own_owner_id(lock_client: LockClient) -> None:
    lock = lock_client.lock("forked-lean")
    assert lock.acquire()
    try:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its calls must not re-enter the parent's hold
            try:
                report = "granted" if lock.acquire(blocking=False) else "refused"
            except BaseException as error:  # noqa: BLE001 -- any error is reported to the parent
                report = repr(error)
            os.write(write_end, report.encode())
            os._exit(0)
        os.close(write_end)
        _, status = os.waitpid(pid, 0)
        report = os.read(read_end, 200).decode()
        os.close(read_end)
        assert status == 0
        assert report == "refused"
        assert lock.hold_count() == 1
    finally:
        lock.release()


@pytest.mark.parametrize(
    "options", [{"decode_responses": True}, {"protocol": 3}], ids=["decoded", "resp3"]
)
def test_replies_of_any_decoding_or_protocol(redis_url: str, options: dict[str, object]) -> None:
    client = LockClient(redis.Redis.from_url(redis_url, **options), key_prefix="test")
    try:
        assert isinstance(client.held(), HeldClient)
        lock = client.lock("decoded")
        with lock, lock:
            assert lock.hold_count() == 2
            assert lock.token is not None and lock.token > 0
        assert not lock.locked()
    finally:
        client.close()
