"""Mutual exclusion under contention, across processes and threads, and waiter wake-ups."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time

import pytest
import redis

from django_rlock.core import LockClient, LockNotOwnedError
from django_rlock.core._protocol.channels import LINGER_SECONDS, listen_channels
from django_rlock.core._sync.watchdog import get_watchdog

pytestmark = pytest.mark.slow


def _increment_under_lock(
    url: str, rounds: int, barrier: multiprocessing.synchronize.Barrier
) -> None:
    raw = redis.Redis.from_url(url)
    with LockClient(url, key_prefix="test") as client:
        lock = client.lock("counter")
        barrier.wait(30)
        for _ in range(rounds):
            with lock:
                if raw.incr("inside") != 1:
                    raw.incr("overlaps")
                value = int(raw.get("count") or 0)  # a deliberately non-atomic read-modify-write
                raw.set("count", value + 1)
                raw.decr("inside")
    raw.close()


def test_sixteen_processes_never_overlap(redis_url: str, r: redis.Redis) -> None:
    processes, rounds = 16, 500
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(processes)
    workers = [
        context.Process(target=_increment_under_lock, args=(redis_url, rounds, barrier))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=240)
    assert [worker.exitcode for worker in workers] == [0] * processes
    assert int(r.get("count") or 0) == processes * rounds
    assert int(r.get("overlaps") or 0) == 0


def _channels_of(client: LockClient, name: str) -> set[bytes]:
    """The channels a waiter of lock ``name`` listens on through ``client``'s listener."""
    waiter_id = client.listener.new_waiter_id()
    return set(listen_channels(client.lock(name).keys.channel.encode(), waiter_id))


def _subscribes(r: redis.Redis) -> int:
    return int(r.info("commandstats").get("cmdstat_subscribe", {}).get("calls", 0))


def _wait_behind_holder(client: LockClient, name: str) -> None:
    """One acquire that waits: another thread holds ``name`` and releases it 0.1 s later."""
    lock = client.lock(name)
    held, go = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            go.wait(30)
            time.sleep(0.1)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(30)
    go.set()
    assert lock.acquire(timeout=30)
    lock.release()
    holder.join(30)


def test_the_next_wait_for_a_lock_reuses_its_subscription(
    lock_client: LockClient, r: redis.Redis
) -> None:
    # A lock contended in a loop: its waiter's channels stay subscribed after
    # a grant, so the next wait costs no SUBSCRIBE round trip.
    _wait_behind_holder(lock_client, "again")
    before = _subscribes(r)
    assert before >= 1
    _wait_behind_holder(lock_client, "again")
    assert _subscribes(r) == before
    assert lock_client.listener.subscribed_channels() == _channels_of(lock_client, "again")


def _script_calls(r: redis.Redis) -> int:
    return int(r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def test_a_wait_for_a_lock_whose_channels_linger_starts_registered(
    lock_client: LockClient, r: redis.Redis
) -> None:
    # The attempt that does not wait would only find the lock held again: a
    # waiter whose channels are confirmed already sends its registered attempt
    # first (plan.SUBSCRIBED), one script call fewer than the first wait's.
    _wait_behind_holder(lock_client, "warm")  # the scripts loaded, the connections made
    before = _script_calls(r)
    _wait_behind_holder(lock_client, "loop")
    first = _script_calls(r) - before
    before = _script_calls(r)
    _wait_behind_holder(lock_client, "loop")
    assert _script_calls(r) - before == first - 1


def test_lingering_channels_end_at_the_next_wait_after_a_second(
    lock_client: LockClient, r: redis.Redis
) -> None:
    _wait_behind_holder(lock_client, "first")
    time.sleep(LINGER_SECONDS + 0.1)
    _wait_behind_holder(lock_client, "second")
    # "first"'s channels were unsubscribed as the wait for "second" ended.
    assert lock_client.listener.subscribed_channels() == _channels_of(lock_client, "second")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(
        count for _, count in r.pubsub_numsub(*_channels_of(lock_client, "first"))
    ):
        time.sleep(0.01)
    assert not any(count for _, count in r.pubsub_numsub(*_channels_of(lock_client, "first")))


def test_contended_threads_leave_no_subscription_and_no_thread(
    lock_client: LockClient, r: redis.Redis
) -> None:
    threads_before = set(threading.enumerate())
    threads, rounds = 10, 500
    lock = lock_client.lock("threads")
    counter = {"value": 0, "inside": 0, "overlaps": 0}

    def work() -> None:
        for _ in range(rounds):
            with lock:
                counter["inside"] += 1
                if counter["inside"] != 1:
                    counter["overlaps"] += 1
                counter["value"] += 1
                counter["inside"] -= 1

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=240)
    assert counter["value"] == threads * rounds
    assert counter["overlaps"] == 0
    # The last granted waiter's channels may linger for the lock's next wait
    # (ChannelTable.remove): this lock's two, nothing else; none after close.
    assert lock_client.listener.subscribed_channels() <= _channels_of(lock_client, "threads")
    lock_client.close()
    deadline = time.monotonic() + 5
    while r.pubsub_channels() and time.monotonic() < deadline:
        time.sleep(0.01)  # closing the connection ends its subscriptions
    assert r.pubsub_channels() == []
    extra = {thread.name for thread in set(threading.enumerate()) - threads_before}
    assert extra <= {"rlock-watchdog"}


def test_a_waiter_survives_its_pubsub_connection_being_killed(
    lock_client: LockClient, r: redis.Redis
) -> None:
    lock = lock_client.lock("killed-pubsub")
    holder_has_it, let_go = threading.Event(), threading.Event()

    def holder() -> None:
        with lock:
            holder_has_it.set()
            let_go.wait(30)

    holding = threading.Thread(target=holder)
    holding.start()
    assert holder_has_it.wait(5)
    waited: dict[str, float] = {}

    def waiter() -> None:
        if lock.acquire(timeout=60):
            waited["acquired_at"] = time.monotonic()
            lock.release()

    waiting = threading.Thread(target=waiter)
    waiting.start()
    deadline = time.monotonic() + 5
    while not r.pubsub_numsub("test:{killed-pubsub}:released")[0][1]:
        assert time.monotonic() < deadline, "the waiter never subscribed"
        time.sleep(0.01)
    assert r.client_kill_filter(_type="pubsub") >= 1
    time.sleep(0.3)  # let the dispatcher notice and resubscribe
    released_at = time.monotonic()
    let_go.set()
    holding.join(10)
    waiting.join(30)
    # Far inside the holder's 30 s PTTL: the wake-up came by message, not expiry.
    assert waited["acquired_at"] - released_at < 2.0


def test_fork_after_acquire_leaves_the_lock_with_the_parent(
    lock_client: LockClient, r: redis.Redis
) -> None:
    lock = lock_client.lock("forked")
    lock.acquire()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it sees through the pipe, then leave
        outcome = "no error"
        try:
            lock.release()
        except LockNotOwnedError:
            outcome = "LockNotOwnedError"
        except BaseException as error:  # noqa: BLE001 -- any error is reported to the parent
            outcome = repr(error)
        own = lock_client.lock("child-own")
        child_ok = own.acquire(blocking=False) and own.owned() and not lock.owned()
        watchdog_thread = get_watchdog().thread
        child_ok = child_ok and watchdog_thread is not None and watchdog_thread.is_alive()
        own.release()
        os.write(write_end, f"{outcome} {child_ok}".encode())
        os._exit(0)
    os.close(write_end)
    _, status = os.waitpid(pid, 0)
    report = os.read(read_end, 200).decode()
    os.close(read_end)
    assert status == 0
    assert report == "LockNotOwnedError True"
    assert lock.owned() and lock.hold_count() == 1
    lock.release()
    assert not lock.locked()


def test_targeted_wakeups_hand_the_lock_down_a_queue_of_waiters(
    lock_client: LockClient, r: redis.Redis
) -> None:
    lock = lock_client.lock("queue")
    lock.acquire()  # watchdog hold: each waiter's PTTL fallback would be 30 s
    acquired: list[float] = []

    def waiter() -> None:
        if lock.acquire(timeout=25):
            acquired.append(time.monotonic())
            time.sleep(0.01)
            lock.release()

    waiters = [threading.Thread(target=waiter) for _ in range(5)]
    for thread in waiters:
        thread.start()
    deadline = time.monotonic() + 5
    while r.zcard("test:{queue}:waiters") < 5:
        assert time.monotonic() < deadline, "the waiters never registered"
        time.sleep(0.01)
    released_at = time.monotonic()
    lock.release()
    for thread in waiters:
        thread.join(30)
    assert len(acquired) == 5
    # Each release woke the next waiter by message, far inside the 30 s PTTL.
    assert max(acquired) - released_at < 5
    assert not r.exists("test:{queue}:waiters")


def test_a_waiter_that_gives_up_leaves_the_waiting_set(
    lock_client: LockClient, r: redis.Redis
) -> None:
    lock = lock_client.lock("impatient")
    holder = threading.Thread(target=lock.acquire)
    holder.start()
    holder.join()
    assert lock.acquire(timeout=0.3) is False
    assert not r.exists("test:{impatient}:waiters")
    assert lock_client.listener.subscribed_channels() == set()
