"""Fixtures of the Celery tests: the test app on the test Redis, and one real worker.

The broker, the result backend and the locks all live in database 1 of the
session's redis-server. Tests never flush it while the worker runs (that would
drop kombu's bindings); each test uses fresh lock names instead (``run``).
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery.result import AsyncResult

from django_rlock.core._protocol.names import LockKeys
from tests.celery import app as test_app
from tests.celery.workers import Worker
from tests.servers import RedisServer

#: The watchdog timeout of the shared worker: short, so expiry tests are fast.
WATCHDOG_TIMEOUT = 1.0


@pytest.fixture(scope="package")
def broker_url(redis_server: RedisServer) -> str:
    url = redis_server.url.rsplit("/", 1)[0] + "/1"
    # The worker finds its lock server through broker_url; this process names
    # it explicitly, because pytest-django configures Django settings here.
    test_app.configure(url, watchdog_timeout=WATCHDOG_TIMEOUT, rlock_url=url)
    return url


@pytest.fixture(scope="package")
def worker(broker_url: str) -> Iterator[Worker]:
    """One prefork worker (concurrency 2) shared by every test of this package."""
    with Worker(broker_url, watchdog_timeout=WATCHDOG_TIMEOUT) as running:
        yield running


@pytest.fixture
def store(broker_url: str) -> Iterator[redis.Redis]:
    # Longer than any BLPOP of the tests (wait_started: 20 s): redis-py 8 gives a
    # client a 5 s socket timeout by default, which cut such waits short.
    client = redis.Redis.from_url(broker_url, socket_timeout=60)
    yield client
    client.close()


@pytest.fixture
def run() -> str:
    """A fresh lock-key argument: no test sees another's locks or records."""
    return uuid.uuid4().hex[:12]


def lock_key(name: str) -> str:
    """The Redis hash key of the lock ``name`` under the tests' key prefix."""
    return LockKeys.build("ctest", name).hash


def wait_started(store: redis.Redis, run: str, timeout: float = 20.0) -> dict[str, Any]:
    """The next run of ``run`` that got its lock (what it recorded)."""
    popped = store.blpop([f"ctest:started:{run}"], timeout=timeout)
    assert popped is not None, f"no run of {run} started within {timeout}s"
    started: dict[str, Any] = json.loads(popped[1])
    return started


def intervals(store: redis.Redis, run: str) -> list[tuple[float, float]]:
    """The (start, stop) of every finished run of ``run``, by start."""
    pairs = []
    for raw in store.lrange(f"ctest:intervals:{run}", 0, -1):
        start, stop = (raw.decode() if isinstance(raw, bytes) else raw).split()
        pairs.append((float(start), float(stop)))
    return sorted(pairs)


def assert_no_overlap(pairs: list[tuple[float, float]]) -> None:
    for (_, earlier_stop), (later_start, _) in itertools.pairwise(pairs):
        assert later_start >= earlier_stop, f"runs overlapped: {pairs}"


def open_gate(store: redis.Redis, run: str, tokens: int = 1) -> None:
    store.rpush(f"ctest:gate:{run}", *(["go"] * tokens))


def wait_until_free(store: redis.Redis, name: str, timeout: float) -> float:
    """Seconds until the lock ``name`` is free; fails after ``timeout``."""
    started = time.monotonic()
    deadline = started + timeout
    key = lock_key(name)
    while store.exists(key):
        assert time.monotonic() < deadline, f"lock {name!r} still held after {timeout}s"
        time.sleep(0.005)
    return time.monotonic() - started


def wait_dead(pid: int, timeout: float = 20.0) -> None:
    """Wait until process ``pid`` is gone or a zombie (it no longer runs code)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                state = stat.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.005)
    raise AssertionError(f"process {pid} still alive after {timeout}s")


def wait_for_state(result: AsyncResult, state: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while result.state != state:
        assert time.monotonic() < deadline, f"{result.id} never reached {state}: {result.state}"
        time.sleep(0.02)
