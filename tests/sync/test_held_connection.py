"""The connection each thread holds for its lock calls (LockClient.held)."""

from __future__ import annotations

import os
import threading

import redis

from django_rlock.core import LockClient

HANG = 10.0  # seconds: only ever reached when something hangs


def _last_command(r: redis.Redis, client_id: int) -> str:
    return next(str(entry["cmd"]) for entry in r.client_list() if int(entry["id"]) == client_id)


def test_a_thread_sends_its_acquire_and_release_on_the_connection_it_holds(
    lock_client: LockClient, r: redis.Redis
) -> None:
    held = lock_client.held()
    assert held is not None and lock_client.held() is held
    held_id = held.client_id()
    lock = lock_client.lock("held")
    assert lock.acquire()
    assert _last_command(r, held_id) == "evalsha"
    held.ping()
    lock.release()
    assert _last_command(r, held_id) == "evalsha"
    other: list[redis.Redis | None] = []
    thread = threading.Thread(target=lambda: other.append(lock_client.held()))
    thread.start()
    thread.join(HANG)
    assert other and other[0] is not None and other[0] is not held


def test_a_forked_child_never_uses_its_parents_held_connection(
    lock_client: LockClient,
) -> None:
    held = lock_client.held()
    assert held is not None
    parent_id = held.client_id()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its held connection's id, then leave
        try:
            lock = lock_client.lock("forked-held")
            lock.acquire()
            lock.release()
            child = lock_client.held()
            report = str(child.client_id() if child is not None else "none")
        except BaseException as error:  # noqa: BLE001 -- any error is reported to the parent
            report = repr(error)
        os.write(write_end, report.encode())
        os._exit(0)
    os.close(write_end)
    _, status = os.waitpid(pid, 0)
    report = os.read(read_end, 200).decode()
    os.close(read_end)
    assert status == 0
    assert report.isdigit(), report
    assert int(report) != parent_id
    assert held.client_id() == parent_id  # the parent's connection is still its own


def test_at_most_a_quarter_of_the_pool_is_held_and_the_rest_still_lock(
    redis_server: object, redis_url: str
) -> None:
    pool = redis.ConnectionPool.from_url(redis_url, max_connections=8)
    client = LockClient(redis.Redis(connection_pool=pool), key_prefix="test")
    threads = 6
    barrier = threading.Barrier(threads)
    held: list[redis.Redis | None] = []
    locked: list[bool] = []

    def work(index: int) -> None:
        lock = client.lock(f"quarter-{index}")
        locked.append(lock.acquire(timeout=HANG))
        lock.release()
        held.append(client.held())
        barrier.wait(HANG)  # all alive at once: nobody's held client was collected

    workers = [threading.Thread(target=work, args=(index,)) for index in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(HANG)
    assert locked == [True] * threads
    assert sum(client is not None for client in held) == 2
    client.close()
    pool.disconnect()


def test_close_gives_the_held_connections_back_to_the_pool(redis_url: str) -> None:
    client = LockClient(redis_url, key_prefix="test")
    lock = client.lock("close-held")
    lock.acquire()
    lock.release()
    held = client.held()
    assert held is not None and held.connection is not None
    client.close()
    assert held.connection is None


def test_close_never_hands_another_threads_held_connection_to_the_pool(redis_url: str) -> None:
    # That thread may be inside a call on it: in the pool, another thread could
    # check it out and read the reply meant for the first (found by review).
    client = LockClient(redis_url, key_prefix="test")
    ready, done = threading.Event(), threading.Event()
    theirs: list[object] = []

    def use_then_wait() -> None:
        lock = client.lock("theirs")
        lock.acquire()
        lock.release()
        held = client.held()
        assert held is not None
        theirs.append(held.connection)
        ready.set()
        done.wait(10)

    thread = threading.Thread(target=use_then_wait)
    thread.start()
    assert ready.wait(10)
    pool = client.redis.connection_pool
    client.close()
    try:
        assert theirs[0] not in pool._available_connections
    finally:
        done.set()
        thread.join(10)
