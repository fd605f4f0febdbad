"""One behavioural contract, run against every lock backend (as Django's cache tests do)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock import locks, rlock
from django_rlock.backends.base import BaseLockBackend
from django_rlock.backends.embedded import EmbeddedRedisLockBackend
from django_rlock.backends.locmem import LocMemLockBackend
from django_rlock.backends.redis import RedisLockBackend
from django_rlock.core import LockLostError, LockNotOwnedError, LockTimeout, RLock
from django_rlock.signals import lock_acquired, lock_lost, lock_released

HANG = 10.0  # seconds: only ever reached when something hangs


def in_thread(target: Any, *args: Any) -> Any:
    """Run ``target(*args)`` on another thread (another owner) and return its result."""
    result: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.append(target(*args))
        except BaseException as error:  # noqa: BLE001 -- re-raised in the test thread
            errors.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(HANG)
    assert not thread.is_alive(), "the other thread hung"
    if errors:
        raise errors[0]
    return result[0]


class LockBackendContract:
    """What every backend must do; subclasses provide the ``backend`` fixture."""

    alias = "default"

    @pytest.fixture
    def backend(self) -> BaseLockBackend:
        return locks[self.alias]

    def test_lock_is_an_rlock_made_with_the_core_signature(self, backend: BaseLockBackend) -> None:
        lock = backend.lock("sig", timeout=0, lease=3, blocking=True)
        assert isinstance(lock, RLock)
        assert (lock.name, lock.timeout, lock.lease, lock.blocking) == ("sig", 0, 3, True)

    def test_reentrant_holds_and_fencing_tokens(self, backend: BaseLockBackend) -> None:
        lock = backend.lock("order:1")
        assert lock.ttl() is None and lock.token is None
        tokens: list[int | None] = []
        for _ in range(2):
            with lock:
                outer = lock.token
                with backend.lock("order:1"):
                    assert lock.hold_count() == 2
                    assert lock.token == outer
                assert lock.owned() and lock.locked()
                ttl = lock.ttl()
                assert ttl is not None and 0 < ttl <= backend.watchdog_timeout
                tokens.append(outer)
        assert not lock.locked() and lock.hold_count() == 0
        assert tokens[0] is not None and tokens[1] is not None and tokens[1] > tokens[0]

    def test_other_threads_are_other_owners(self, backend: BaseLockBackend) -> None:
        lock = backend.lock("shared")
        with lock:
            assert in_thread(lambda: lock.acquire(blocking=False)) is False
            assert in_thread(lock.owned) is False
            assert in_thread(lock.locked) is True
            with pytest.raises(LockNotOwnedError):
                in_thread(lock.release)
        assert in_thread(lambda: lock.acquire(blocking=False)) is True
        assert lock.locked() and not lock.owned()

    def test_busy_with_raises_lock_timeout_with_retry_after(self, backend: BaseLockBackend) -> None:
        in_thread(lambda: backend.lock("busy").acquire(lease=20))
        with pytest.raises(LockTimeout) as caught, backend.lock("busy", timeout=0.05):
            pytest.fail("acquired a busy lock")
        assert caught.value.retry_after is not None and 0 < caught.value.retry_after <= 20
        assert isinstance(caught.value, TimeoutError)

    def test_a_waiter_gets_the_lock_when_it_is_released(self, backend: BaseLockBackend) -> None:
        lock = backend.lock("handover")
        lock.acquire()
        got = threading.Event()

        def wait_for_it() -> bool:
            acquired = lock.acquire(timeout=HANG)
            got.set()
            lock.release()
            return acquired

        waiter = threading.Thread(target=wait_for_it)
        waiter.start()
        assert not got.wait(0.1)
        lock.release()
        assert got.wait(HANG)
        waiter.join(HANG)

    def test_mutual_exclusion_under_contention(self, backend: BaseLockBackend) -> None:
        inside: list[int] = []
        overlaps: list[int] = []

        def work(worker: int) -> None:
            for _ in range(10):
                with backend.lock("counter", timeout=HANG):
                    inside.append(worker)
                    if len(inside) > 1:
                        overlaps.append(worker)
                    inside.remove(worker)

        threads = [threading.Thread(target=work, args=(worker,)) for worker in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(HANG)
        assert overlaps == []
        assert not backend.lock("counter").locked()

    def test_an_expired_lease_is_lost_and_release_says_so(self, backend: BaseLockBackend) -> None:
        lock = backend.lock("leased")
        assert lock.acquire(lease=0.1)
        time.sleep(0.2)
        assert in_thread(lambda: lock.acquire(blocking=False)) is True
        assert lock.lost
        with pytest.raises(LockLostError):
            lock.release()
        assert lock.locked()  # the other owner's hold is untouched

    def test_force_release_breaks_the_hold_and_reports_it_lost(
        self, backend: BaseLockBackend
    ) -> None:
        lock = backend.lock("forced")
        lost = threading.Event()
        lock.on_lost(lambda lost_lock: lost.set())
        signalled: list[dict[str, Any]] = []

        def receiver(**kwargs: Any) -> None:
            signalled.append(kwargs)

        lock_lost.connect(receiver)
        try:
            lock.acquire()
            assert in_thread(backend.force_release, "forced") is True
            assert not lock.locked()
            assert lost.wait(HANG)
            deadline = time.monotonic() + HANG
            while not signalled and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            lock_lost.disconnect(receiver)
        assert [(s["name"], s["alias"]) for s in signalled] == [("forced", self.alias)]
        with pytest.raises(LockLostError):
            lock.release()
        assert backend.force_release("forced") is False

    def test_signals_for_first_hold_and_last_release(self, backend: BaseLockBackend) -> None:
        events: list[tuple[str, dict[str, Any]]] = []

        def on_acquired(**kwargs: Any) -> None:
            events.append(("acquired", kwargs))

        def on_released(**kwargs: Any) -> None:
            events.append(("released", kwargs))

        lock_acquired.connect(on_acquired)
        lock_released.connect(on_released)
        try:
            with rlock("signalled", using=self.alias), rlock("signalled", using=self.alias):
                pass
        finally:
            lock_acquired.disconnect(on_acquired)
            lock_released.disconnect(on_released)
        assert [kind for kind, _ in events] == ["acquired", "released"]
        acquired, released = events[0][1], events[1][1]
        assert acquired["sender"] is type(backend)
        assert (acquired["name"], acquired["alias"]) == ("signalled", self.alias)
        assert acquired["waited"] >= 0 and released["held"] >= 0
        assert released["lost"] is False

    def test_names_and_inspect(self, backend: BaseLockBackend) -> None:
        held = backend.lock("report:{7}")  # braces in a name are the library's business
        held.acquire()
        held.acquire()
        in_thread(lambda: backend.lock("report:8").acquire(lease=9))
        backend.lock("other").acquire()
        assert sorted(backend.names("report:*")) == ["report:8", "report:{7}"]
        assert sorted(backend.names()) == ["other", "report:8", "report:{7}"]
        info = backend.inspect("report:{7}")
        assert info is not None
        assert list(info.holders.values()) == [2]
        assert info.token == held.token
        assert info.ttl is not None and 0 < info.ttl <= backend.watchdog_timeout
        other = backend.inspect("report:8")
        assert other is not None and other.ttl is not None and other.ttl <= 9
        assert next(iter(other.holders)) != next(iter(info.holders))
        assert backend.inspect("free") is None

    def test_bad_arguments_are_value_errors(self, backend: BaseLockBackend) -> None:
        with pytest.raises(ValueError, match="lock name must not be empty"):
            backend.lock("")
        with pytest.raises(ValueError, match="lease"):
            backend.lock("x", lease=0)
        with pytest.raises(ValueError, match="non-blocking"):
            backend.lock("x").acquire(blocking=False, timeout=1)
        with pytest.raises(ValueError, match=r"non-blocking call \(blocking=False, timeout=1\.0\)"):
            backend.lock("x", blocking=False, timeout=1)  # refused when built, not at `with`


class TestRedisBackend(LockBackendContract):
    alias = "default"

    def test_is_the_redis_backend(self, backend: BaseLockBackend) -> None:
        assert isinstance(backend, RedisLockBackend)


class TestLocMemBackend(LockBackendContract):
    alias = "mem"

    def test_is_the_locmem_backend_and_touches_no_redis(
        self, backend: BaseLockBackend, r: Any
    ) -> None:
        assert isinstance(backend, LocMemLockBackend)
        with backend.lock("x"):
            assert r.dbsize() == 0


class TestEmbeddedBackend(LockBackendContract):
    alias = "embedded"

    @pytest.fixture
    def backend(self, embedded: BaseLockBackend) -> BaseLockBackend:
        return embedded


@pytest.fixture(scope="module")
def embedded_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("embedded") / "locks.rdb"


@pytest.fixture
def embedded(
    settings: SettingsWrapper, rlocks: dict[str, Any], embedded_path: Path
) -> BaseLockBackend:
    settings.RLOCKS = {
        **rlocks,
        "embedded": {
            "BACKEND": "django_rlock.backends.embedded.EmbeddedRedisLockBackend",
            "LOCATION": str(embedded_path),
            "KEY_PREFIX": "t",
            "WATCHDOG_TIMEOUT": 5,
        },
    }
    backend = locks["embedded"]
    assert isinstance(backend, EmbeddedRedisLockBackend)
    backend.client.redis.flushall()
    return backend


def test_embedded_server_is_shared_by_the_processes_of_the_machine(
    embedded: BaseLockBackend, embedded_path: Path
) -> None:
    code = (
        "import django\n"
        "from django.conf import settings\n"
        "settings.configure(RLOCKS={'default': {\n"
        "    'BACKEND': 'django_rlock.backends.embedded.EmbeddedRedisLockBackend',\n"
        f"    'LOCATION': {str(embedded_path)!r}, 'KEY_PREFIX': 't'}}}})\n"
        "django.setup()\n"
        "from django_rlock import locks\n"
        "lock = locks['default'].lock('machine-wide')\n"
        "print(lock.locked(), lock.acquire(blocking=False))\n"
    )
    with embedded.lock("machine-wide"):
        result = subprocess.run(
            [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60
        )
    assert result.stdout.split() == ["True", "False"], result.stderr
    assert not embedded.lock("machine-wide").locked()
