"""RLock semantics on one Redis: reentrancy, ownership, leases, inspection, fencing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_rlock.core import (
    LockClient,
    LockNotOwnedError,
    LockTimeout,
    LockUnavailableError,
    RLock,
)
from django_rlock.core._process.identity import process_id
from django_rlock.core.defaults import MIN_WATCHDOG_TIMEOUT
from tests.servers import RedisServer, free_port


def test_reentrant_holds_are_counted(lock_client: LockClient, r: redis.Redis) -> None:
    lock = lock_client.lock("order:1")
    assert lock.acquire()
    assert lock.acquire()
    assert lock.acquire(lease=5)
    assert lock.hold_count() == 3
    assert lock.owned() and lock.locked()
    lock.release()
    lock.release()
    assert lock.hold_count() == 1
    assert lock.locked()
    lock.release()
    assert not lock.locked()
    assert lock.hold_count() == 0
    assert r.keys("test:{order:1}") == []


def test_reentry_keeps_the_token_and_new_grants_raise_it(lock_client: LockClient) -> None:
    lock = lock_client.lock("fenced")
    tokens: list[int] = []
    for _ in range(3):
        with lock:
            outer = lock.token
            assert outer is not None
            with lock:
                assert lock.token == outer
            tokens.append(outer)
    assert lock.token is None
    assert tokens == sorted(set(tokens))
    assert len(tokens) == 3


def test_two_lock_objects_of_one_name_share_the_threads_holds(lock_client: LockClient) -> None:
    first, second = lock_client.lock("shared"), lock_client.lock("shared")
    first.acquire()
    second.acquire()
    assert first.hold_count() == 2
    first.release()
    second.release()
    assert not first.locked()


def test_release_by_a_non_owner_raises_and_changes_nothing(
    lock_client: LockClient, r: redis.Redis
) -> None:
    lock = lock_client.lock("mine")
    lock.acquire()
    before = r.hgetall("test:{mine}")
    errors: list[BaseException] = []

    def other_thread() -> None:
        try:
            lock.release()
        except LockNotOwnedError as error:
            errors.append(error)

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert len(errors) == 1 and "does not hold" in str(errors[0])
    assert r.hgetall("test:{mine}") == before
    lock.release()
    with pytest.raises(LockNotOwnedError):
        lock.release()


def test_each_thread_is_its_own_owner(lock_client: LockClient) -> None:
    lock = lock_client.lock("threads")
    lock.acquire()
    results: list[bool] = []
    thread = threading.Thread(target=lambda: results.append(lock.acquire(blocking=False)))
    thread.start()
    thread.join()
    assert results == [False]
    lock.release()


def test_a_lease_expires_by_itself(lock_client: LockClient, r: redis.Redis) -> None:
    lock = lock_client.lock("leased")
    assert lock.acquire(lease=0.3)
    ttl = lock.ttl()
    assert ttl is not None and 0 < ttl <= 0.3
    time.sleep(0.5)
    assert not lock.locked()
    assert lock.ttl() is None
    assert lock.lost


def test_acquire_with_timeout_gives_up_after_the_timeout(lock_client: LockClient) -> None:
    lock = lock_client.lock("busy")
    holder = threading.Thread(target=lock.acquire)
    holder.start()
    holder.join()
    started = time.monotonic()
    assert lock.acquire(timeout=3) is False
    waited = time.monotonic() - started
    assert 3.0 <= waited <= 3.4
    assert lock.acquire(blocking=False) is False


def test_a_waiter_gets_the_lock_when_it_is_released(lock_client: LockClient) -> None:
    lock = lock_client.lock("handoff")
    acquired = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with lock:
            acquired.set()
            release.wait(5)

    thread = threading.Thread(target=holder)
    thread.start()
    assert acquired.wait(5)
    threading.Timer(0.2, release.set).start()
    assert lock.acquire(timeout=10)
    lock.release()
    thread.join()


def test_context_manager_raises_lock_timeout_with_retry_after(lock_client: LockClient) -> None:
    holder = lock_client.lock("ctx")
    thread = threading.Thread(target=holder.acquire)
    thread.start()
    thread.join()
    waiter = lock_client.lock("ctx", timeout=0.2)
    with pytest.raises(LockTimeout) as caught, waiter:
        pass
    assert isinstance(caught.value, TimeoutError)
    assert caught.value.retry_after is not None
    assert 0 < caught.value.retry_after <= lock_client.watchdog_timeout


def test_force_release_frees_a_lock_held_by_another(lock_client: LockClient) -> None:
    lock = lock_client.lock("stuck")
    thread = threading.Thread(target=lock.acquire)
    thread.start()
    thread.join()
    assert lock.force_release() is True
    assert lock.force_release() is False
    assert lock.acquire(blocking=False)
    lock.release()


def test_ttl_follows_the_watchdog_timeout(redis_url: str, r: redis.Redis) -> None:
    with LockClient(redis_url, watchdog_timeout=7) as client:
        lock = client.lock("ttl")
        assert lock.ttl() is None
        with lock:
            ttl = lock.ttl()
            assert ttl is not None and 6 < ttl <= 7


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"timeout": -1}, "timeout must be >= 0"),
        ({"lease": -1}, "lease must be > 0"),
        ({"lease": 0}, "lease must be > 0"),
        ({"timeout": float("nan")}, "finite"),
        ({"timeout": "3"}, "number of seconds"),
        ({"lease": True}, "number of seconds"),
        ({"blocking": False, "timeout": 1}, "non-blocking"),
    ],
)
def test_bad_arguments_raise_value_error(
    lock_client: LockClient, r: redis.Redis, kwargs: dict[str, object], message: str
) -> None:
    lock = lock_client.lock("args")
    with pytest.raises(ValueError, match=message):
        lock.acquire(**kwargs)  # type: ignore[arg-type]
    assert r.dbsize() == 0


def test_a_non_blocking_lock_with_a_timeout_is_refused_when_built(
    lock_client: LockClient,
) -> None:
    with pytest.raises(ValueError, match="non-blocking"):
        lock_client.lock("args", blocking=False, timeout=5)
    with pytest.raises(ValueError, match="blocking must be True or False"):
        lock_client.lock("args", blocking="no")  # type: ignore[arg-type]
    assert lock_client.lock("args", blocking=False).blocking is False


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"watchdog_timeout": 0}, "watchdog_timeout must be > 0"),
        ({"watchdog_timeout": -5}, "watchdog_timeout must be > 0"),
        ({"key_prefix": "a{b"}, "hash tag"),
        ({"key_prefix": 5}, "must be a str"),
    ],
)
def test_bad_client_settings_raise_value_error(
    redis_url: str, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        LockClient(redis_url, **kwargs)  # type: ignore[arg-type]


@pytest.mark.pure
def test_bad_connection_raises_value_error() -> None:
    with pytest.raises(ValueError, match="redis URL"):
        LockClient(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="invalid redis URL"):
        LockClient("http://example.invalid")


def test_unreachable_redis_fails_fast_naming_the_server_and_keeps_no_state() -> None:
    port = free_port()
    client = LockClient(
        redis.Redis(host="127.0.0.1", port=port, socket_timeout=1, socket_connect_timeout=1)
    )
    lock = client.lock("nowhere")
    started = time.monotonic()
    with pytest.raises(LockUnavailableError, match=f"127.0.0.1:{port}") as caught:
        lock.acquire()
    assert isinstance(caught.value.__cause__, redis.ConnectionError)
    assert time.monotonic() - started < 10
    assert client.watched_holds() == []
    assert lock.token is None and not lock.lost
    client.close()


def test_rlock_repr_shows_the_name_only(lock_client: LockClient) -> None:
    lock = lock_client.lock("visible")
    with lock:
        assert repr(lock) == "<RLock 'visible'>"
        assert process_id() not in repr(lock) + repr(lock_client)
    assert isinstance(lock, RLock)


def test_core_works_without_django_settings(redis_url: str, r: redis.Redis) -> None:
    code = (
        "import os, sys\n"
        "assert 'DJANGO_SETTINGS_MODULE' not in os.environ\n"
        "from django_rlock.core import LockClient\n"
        "from django_rlock.exceptions import LockTimeout\n"
        f"client = LockClient({redis_url!r}, key_prefix='nodjango')\n"
        "with client.lock('x') as lock:\n"
        "    assert lock.owned() and lock.token > 1\n"
        "assert not lock.locked()\n"
        "from django.conf import settings\n"
        "assert not settings.configured\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.stdout.strip() == "ok", result.stderr


def test_a_new_thread_never_inherits_an_ended_threads_hold(lock_client: LockClient) -> None:
    lock = lock_client.lock("inherited")
    for _ in range(20):  # thread idents are reused quickly; owner ids must not be
        first = threading.Thread(target=lambda: lock.acquire(lease=30))
        first.start()
        first.join()
        outcome: list[bool] = []
        second = threading.Thread(
            target=lambda out=outcome: out.append(lock.acquire(blocking=False))
        )
        second.start()
        second.join()
        assert outcome == [False]
        assert lock.force_release()


def test_a_failed_release_stops_renewal_so_the_lock_expires() -> None:
    with RedisServer() as server:
        raw = server.client()
        client = LockClient(
            redis.Redis(
                host="127.0.0.1", port=server.port, socket_timeout=0.3, retry=Retry(NoBackoff(), 0)
            ),
            key_prefix="test",
            watchdog_timeout=1.0,
        )
        lock = client.lock("unreleasable")
        lock.acquire()
        assert server.process is not None
        server.process.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(LockUnavailableError):
                lock.release()
        finally:
            server.process.send_signal(signal.SIGCONT)
        assert client.watched_holds() == []  # nothing left to renew
        deadline = time.monotonic() + 5
        while raw.exists("test:{unreleasable}"):
            assert time.monotonic() < deadline, "the watchdog kept a failed release alive"
            time.sleep(0.05)
        with pytest.raises(LockNotOwnedError):
            lock.release()
        client.close()
        raw.close()


@pytest.mark.parametrize("timeout", [0.1, 0.49])
def test_a_watchdog_timeout_below_the_floor_is_refused(redis_url: str, timeout: float) -> None:
    with pytest.raises(ValueError, match=r"watchdog_timeout must be at least 0\.5 seconds"):
        LockClient(redis_url, watchdog_timeout=timeout)
    with LockClient(redis_url, watchdog_timeout=MIN_WATCHDOG_TIMEOUT) as client:
        assert client.watchdog_timeout == 0.5
