"""The read-write lock: many readers or one writer, against a real redis-server.

Exclusion is checked by a machine: threads read and write under random timing,
each recording the interval it held, and a checker asserts afterwards that no
write interval overlaps any other owner's hold.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import redis

from django_rlock import LockUpgradeError as ExportedUpgradeError
from django_rlock.core import (
    LockClient,
    LockLostError,
    LockNotOwnedError,
    LockUpgradeError,
    ReadWriteLock,
    RLock,
)
from django_rlock.core._process.identity import thread_owner
from django_rlock.core._protocol.rwlock import RWKeys
from tests.threads import run_to_end


def in_thread(call: object, *args: object) -> object:
    """What ``call(*args)`` returns when another thread (another owner) makes it."""
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(call(*args)))  # type: ignore[operator]
    thread.start()
    thread.join(30)
    assert result, "the call in the other thread did not finish"
    return result[0]


def try_once(side: RLock) -> bool:
    """One attempt on ``side``, given back at once if granted: whether it was free."""
    granted = side.acquire(blocking=False)
    if granted:
        side.release()
    return granted


def test_many_readers_hold_it_at_once(lock_client: LockClient) -> None:
    rw = lock_client.read_write_lock("report")
    readers = 5
    all_in = threading.Barrier(readers, timeout=20)
    seen: list[bool] = []

    def read() -> None:
        with rw.read:
            all_in.wait()  # every reader holds the read lock at this moment
            seen.append(rw.read.owned() and rw.read.locked() and not rw.write.locked())

    threads = [threading.Thread(target=read) for _ in range(readers)]
    run_to_end(threads, 30)
    assert seen == [True] * readers
    assert not rw.read.locked()


def test_a_writer_excludes_readers_and_other_writers(lock_client: LockClient) -> None:
    rw = lock_client.read_write_lock("report")
    with rw.write:
        assert rw.write.locked() and rw.write.owned()
        assert in_thread(rw.read.acquire, False) is False
        assert in_thread(rw.write.acquire, False) is False
    assert in_thread(try_once, rw.read)


def test_readers_exclude_a_writer_until_the_last_leaves(lock_client: LockClient) -> None:
    rw = lock_client.read_write_lock("report")
    rw.read.acquire()
    assert in_thread(rw.read.acquire, False) is True  # a second reader (that thread keeps it)
    assert in_thread(rw.write.acquire, False) is False
    rw.read.release()
    assert in_thread(rw.write.acquire, False) is False  # the other reader still holds it


def test_the_writer_may_read_and_its_reads_keep_out_writers_only(lock_client: LockClient) -> None:
    rw = lock_client.read_write_lock("report")
    rw.write.acquire()
    assert rw.read.acquire(blocking=False)
    assert rw.read.owned() and rw.read.token == 0
    rw.write.release()  # still reading: others may read now, not write
    assert in_thread(try_once, rw.read)
    assert in_thread(rw.write.acquire, False) is False
    rw.read.release()
    assert in_thread(try_once, rw.write)


def test_a_reader_asking_to_write_is_refused_at_once(lock_client: LockClient) -> None:
    rw = lock_client.read_write_lock("report")
    with rw.read, rw.read:
        started = time.monotonic()
        with pytest.raises(LockUpgradeError, match="holds its read lock"):
            rw.write.acquire()  # no timeout: waiting would never end
        with pytest.raises(ExportedUpgradeError):
            rw.write.acquire(timeout=10)
        assert time.monotonic() - started < 5  # at once, not after a wait
        assert rw.read.hold_count() == 2 and not rw.write.locked()  # nothing changed
    assert rw.write.acquire(blocking=False)  # once every read is given back
    rw.write.release()


def test_each_side_is_reentrant_per_owner(lock_client: LockClient, r: redis.Redis) -> None:
    rw = lock_client.read_write_lock("report")
    with rw.write:
        token = rw.write.token
        with rw.write, rw.read, rw.read:
            assert rw.write.hold_count() == 2 and rw.read.hold_count() == 2
            assert rw.write.token == token
        assert rw.write.hold_count() == 1 and rw.read.hold_count() == 0
    assert not rw.write.locked() and not rw.read.locked()
    assert rw.read.ttl() is None and rw.write.ttl() is None
    with pytest.raises(LockNotOwnedError):
        rw.read.release()
    with pytest.raises(LockNotOwnedError):
        rw.write.release()


def test_write_tokens_strictly_increase(lock_client: LockClient, r: redis.Redis) -> None:
    rw = lock_client.read_write_lock("report")
    tokens: list[int] = []
    for round_ in range(5):
        with rw.write:
            assert rw.write.token is not None
            tokens.append(rw.write.token)
        if round_ == 2:
            r.flushall()  # the counter is gone: the clock floor still holds
    assert tokens == sorted(set(tokens)), tokens


def test_keys_share_one_slot_and_never_meet_a_plain_lock_of_the_name(
    lock_client: LockClient,
) -> None:
    keys = RWKeys.build("test", "a{b}c")
    plain = lock_client.lock("a{b}c").keys
    derived = [keys.write, keys.fence, keys.readers, keys.reader("o"), keys.waiters, keys.channel]
    tag = plain.hash.removeprefix("test:")
    assert all(key.startswith(f"test:{tag}:rw:") for key in derived)
    assert not {plain.hash, plain.fence, plain.waiters, plain.channel} & set(derived)


def test_bad_input_is_refused_clearly(redis_url: str, lock_client: LockClient) -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        lock_client.read_write_lock("")
    with pytest.raises(ValueError, match="lease must be > 0"):
        lock_client.read_write_lock("x").read.acquire(lease=0)
    with pytest.raises(ValueError, match="can't specify a timeout"):
        lock_client.read_write_lock("x").write.acquire(blocking=False, timeout=1)
    with (
        LockClient(redis_url, key_prefix="test", min_replicas=1) as synced,
        pytest.raises(ValueError, match="min_replicas"),
    ):
        synced.read_write_lock("x")


def test_a_resent_call_is_not_applied_twice(lock_client: LockClient, r: redis.Redis) -> None:
    """The request latch: a lost reply's resend reports instead of re-entering or releasing."""
    rw = lock_client.read_write_lock("report")
    owner = thread_owner()
    for side in (rw.read, rw.write):
        call = side._acquire_call(owner, None, "", 0.0)
        send = side._acquire_sender()
        first = send(keys=call.keys, args=call.args)
        again = send(keys=call.keys, args=call.args)  # same request id
        assert [int(first[1]), int(again[1])] == [1, 1]
        assert side.hold_count() == 1
        release = side._release_call(owner)
        assert int(side._release_sender()(keys=release.keys, args=release.args)) == 0
        assert int(side._release_sender()(keys=release.keys, args=release.args)) == 0
        assert side.hold_count() == 0


# -- the watchdog ------------------------------------------------------------------


@pytest.mark.slow
def test_the_watchdog_keeps_read_and_write_holds_past_the_timeout(
    redis_url: str, r: redis.Redis
) -> None:
    # 3 s, not less: at 0.6 s a renewal had 0.1 s, which a loaded machine's
    # late watchdog thread missed (the holds were rightly lost).
    with LockClient(redis_url, key_prefix="test", watchdog_timeout=3) as client:
        rw = client.read_write_lock("renewed")
        rw.write.acquire()
        rw.read.acquire()
        other = client.read_write_lock("renewed-read")
        # Another live thread's read, renewed too (a thread that ended holding
        # would have its holds given back: core/leaks.py).
        took, done = threading.Event(), threading.Event()

        def read_until_done() -> None:
            other.read.acquire()
            took.set()
            done.wait(10)
            other.read.release()

        reader = threading.Thread(target=read_until_done)
        reader.start()
        assert took.wait(10)
        time.sleep(3.5)  # more than the timeout: only renewals keep them
        assert rw.write.owned() and rw.read.owned() and other.read.locked()
        assert not rw.write.lost and not rw.read.lost
        assert in_thread(rw.read.acquire, False) is False
        assert in_thread(other.write.acquire, False) is False
        done.set()
        reader.join(10)
        rw.read.release()
        rw.write.release()


@contextmanager
def holder(url: str, name: str, side: str, watchdog_timeout: float) -> Iterator[int]:
    """A process holding ``side`` of ``name``; yields its pid once it holds it."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.sync.rwholder", url, name, str(watchdog_timeout), side],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, "the holder process ended without taking the lock"
        json.loads(line)
        yield process.pid
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


@pytest.mark.slow
@pytest.mark.parametrize("side", ["read", "write"])
def test_a_killed_holders_hold_frees_within_the_watchdog_timeout(
    redis_url: str, r: redis.Redis, side: str
) -> None:
    timeout = 1.0
    with (
        LockClient(redis_url, key_prefix="test", watchdog_timeout=timeout) as client,
        holder(redis_url, "killed", side, timeout) as pid,
    ):
        rw = client.read_write_lock("killed")
        assert not rw.write.acquire(blocking=False)
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        assert rw.write.acquire(timeout=10)  # a writer waits for readers and writers alike
        assert time.monotonic() - killed_at <= timeout + 1.0
        rw.write.release()
    assert r.scard(RWKeys.build("test", "killed").readers) == 0  # the dead reader was pruned


# -- wake-ups by message -----------------------------------------------------------


def wait_for_waiters(r: redis.Redis, keys: RWKeys, count: int) -> None:
    deadline = time.monotonic() + 10
    while r.zcard(keys.waiters) < count:
        assert time.monotonic() < deadline, "the waiters never registered"
        time.sleep(0.01)


def test_the_last_readers_release_wakes_a_waiting_writer(
    lock_client: LockClient, r: redis.Redis
) -> None:
    rw = lock_client.read_write_lock("woken")
    rw.read.acquire()  # watchdog holds: without a message the writer sleeps ~30 s
    assert in_thread(rw.read.acquire) is True  # a second reader, gone after a while
    granted = threading.Event()

    def writer() -> None:
        if rw.write.acquire(timeout=25):
            granted.set()
            rw.write.release()

    thread = threading.Thread(target=writer)
    thread.start()
    wait_for_waiters(r, rw.keys, 1)
    rw.read.release()  # not the last reader: the writer sleeps on
    assert not granted.wait(0.3)
    rw.read.force_release()  # the other thread's read goes too (an operator's tool)
    released_at = time.monotonic()
    assert granted.wait(10), "the writer was not woken"
    assert time.monotonic() - released_at < 5  # by message, far inside the 30 s PTTL
    thread.join(10)


def test_a_writers_release_wakes_every_waiting_reader(
    lock_client: LockClient, r: redis.Redis
) -> None:
    rw = lock_client.read_write_lock("woken")
    rw.write.acquire()
    readers = 4
    all_in = threading.Barrier(readers + 1, timeout=20)
    granted: list[float] = []

    def reader() -> None:
        if rw.read.acquire(timeout=25):
            granted.append(time.monotonic())
            all_in.wait()  # all hold the read lock together
            rw.read.release()

    threads = [threading.Thread(target=reader) for _ in range(readers)]
    for thread in threads:
        thread.start()
    wait_for_waiters(r, rw.keys, readers)
    released_at = time.monotonic()
    rw.write.release()
    all_in.wait()
    for thread in threads:
        thread.join(10)
    assert len(granted) == readers
    assert max(granted) - released_at < 5  # none slept out the writer's 30 s PTTL


def test_a_writer_waiting_on_a_writer_is_woken(lock_client: LockClient, r: redis.Redis) -> None:
    rw = lock_client.read_write_lock("woken")
    rw.write.acquire()
    token = rw.write.token
    tokens: list[int | None] = []

    def writer() -> None:
        if rw.write.acquire(timeout=25):
            tokens.append(rw.write.token)
            rw.write.release()

    thread = threading.Thread(target=writer)
    thread.start()
    wait_for_waiters(r, rw.keys, 1)
    released_at = time.monotonic()
    rw.write.release()
    thread.join(25)
    assert time.monotonic() - released_at < 5
    assert len(tokens) == 1 and tokens[0] is not None and token is not None
    assert tokens[0] > token
    assert r.zcard(rw.keys.waiters) == 0


# -- exclusion, checked on a recorded history -----------------------------------------


@dataclass(frozen=True)
class Held:
    """One hold as a thread saw it: from its grant's return to its release's call."""

    owner: int
    write: bool
    start: float
    end: float


def overlaps(history: list[Held]) -> list[tuple[Held, Held]]:
    """Every pair of holds of different owners that overlap while one of them writes."""
    ordered = sorted(history, key=lambda held: held.start)
    found = []
    for index, held in enumerate(ordered):
        for later in ordered[index + 1 :]:
            if later.start >= held.end:
                break
            if later.owner != held.owner and (later.write or held.write):
                found.append((held, later))
    return found


@pytest.mark.pure
def test_the_overlap_checker_finds_an_overlap() -> None:
    assert overlaps([Held(1, True, 0.0, 2.0), Held(2, False, 1.0, 3.0)])
    assert not overlaps([Held(1, False, 0.0, 2.0), Held(2, False, 1.0, 3.0)])
    assert not overlaps([Held(1, True, 0.0, 1.0), Held(2, True, 1.0, 3.0)])


@pytest.mark.slow
def test_no_write_overlaps_any_other_hold(redis_url: str, r: redis.Redis) -> None:
    """Threads on two clients read, write and read inside writes at random."""
    history: list[Held] = []
    record = threading.Lock()
    errors: list[Exception] = []
    clients = [LockClient(redis_url, key_prefix="test") for _ in range(2)]

    def worker(number: int) -> None:
        chance = random.Random(number)
        rw: ReadWriteLock = clients[number % 2].read_write_lock("history")
        try:
            for _ in range(40):
                write = chance.random() < 0.3
                side = rw.write if write else rw.read
                lease = None if chance.random() < 0.5 else 10.0
                assert side.acquire(timeout=60, lease=lease)
                start = time.monotonic()
                if write and chance.random() < 0.5:
                    with rw.read:  # the writer reads too
                        time.sleep(chance.random() * 0.004)
                time.sleep(chance.random() * 0.004)
                end = time.monotonic()
                side.release()
                with record:
                    history.append(Held(number, write, start, end))
        except Exception as error:  # noqa: BLE001 -- asserted empty below, whatever it is
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(number,)) for number in range(6)]
    try:
        run_to_end(threads, 120)
    finally:
        for client in clients:
            client.close()
    assert errors == []
    assert len(history) == 6 * 40
    assert sum(held.write for held in history) > 20  # both kinds really ran
    assert overlaps(history) == []
    keys = RWKeys.build("test", "history")
    assert not r.exists(keys.write) and not r.exists(keys.readers)  # all given back


# -- losses, leases and the index -----------------------------------------------------


@pytest.mark.slow
def test_a_read_hold_taken_away_is_reported_lost(redis_url: str, r: redis.Redis) -> None:
    with LockClient(redis_url, key_prefix="test", watchdog_timeout=0.6) as client:
        rw = client.read_write_lock("taken")
        called = threading.Event()
        rw.read.on_lost(lambda _lock: called.set())
        rw.read.acquire()
        assert rw.read.force_release()  # an operator deletes every read hold
        assert called.wait(5), "the watchdog did not report the loss"
        assert rw.read.lost
        with pytest.raises(LockLostError):
            rw.read.release()
        assert rw.write.acquire(blocking=False)  # nothing is left held
        rw.write.release()


def test_a_read_hold_declared_lost_is_granted_anew(lock_client: LockClient, r: redis.Redis) -> None:
    """A loss declared on the local deadline while the key lived on: the next
    acquire takes the old holds off, never re-entering them."""
    rw = lock_client.read_write_lock("revived")
    rw.read.acquire()
    rw.read.acquire()
    (hold,) = lock_client.watched_holds()
    lock_client.declare_lost(hold, "the local deadline passed")
    assert rw.read.hold_count() == 2  # the server still counts both
    for _ in range(2):  # each hold given back hears of the loss
        with pytest.raises(LockLostError):
            rw.read.release()
    assert rw.read.acquire(blocking=False)
    assert not rw.read.lost and rw.read.hold_count() == 1
    rw.read.release()
    assert not rw.read.locked()


def test_a_fixed_lease_read_expires_and_can_be_extended(
    lock_client: LockClient, r: redis.Redis
) -> None:
    rw = lock_client.read_write_lock("leased")
    rw.read.acquire(lease=0.3)
    ttl = rw.read.ttl()
    assert ttl is not None and 0 < ttl <= 0.3
    rw.read.extend(30)
    ttl = rw.read.ttl()
    assert ttl is not None and 25 < ttl <= 30
    rw.read.extend(0.2)
    time.sleep(0.3)
    assert not rw.read.locked()
    assert in_thread(try_once, rw.write) is True  # the expired reader no longer blocks
    with pytest.raises(LockLostError):
        rw.read.release()


def test_the_index_keeps_only_live_readers(lock_client: LockClient, r: redis.Redis) -> None:
    rw = lock_client.read_write_lock("indexed")
    r.sadd(rw.keys.readers, "dead-1", "dead-2")  # readers whose keys expired
    assert not rw.read.locked()  # inspection counts live readers only
    rw.read.acquire()
    assert r.scard(rw.keys.readers) == 3
    rw.read.release()  # a final read release prunes the dead
    assert not r.exists(rw.keys.readers)
    for _ in range(50):
        with rw.read:
            pass
    assert not r.exists(rw.keys.readers)
    assert r.ttl(rw.keys.write) == -2


def test_a_read_declared_lost_does_not_refuse_its_owner_the_write(
    lock_client: LockClient, r: redis.Redis
) -> None:
    """Found by the model soak (tests/model, --kind mixed): a read declared lost
    while its key lived on (a stall, a lost reply, a closed client) made its
    owner's write acquire answer LockUpgradeError, telling it to release a read
    it had already given up, until the key expired."""
    rw = lock_client.read_write_lock("given-up")
    rw.read.acquire()
    (hold,) = lock_client.watched_holds()
    lock_client.declare_lost(hold, "the local deadline passed")
    with pytest.raises(LockLostError):
        rw.read.release()
    assert rw.read.hold_count() == 1  # the server still counts the lost read
    assert rw.write.acquire(blocking=False)  # the lost read is taken off, not upgraded
    assert rw.read.hold_count() == 0
    assert not in_thread(try_once, rw.read)  # a writer now: other readers wait
    rw.write.release()
    assert in_thread(try_once, rw.read)
