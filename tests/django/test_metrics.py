"""Prometheus metrics (RLOCK_METRICS = "prometheus"), read from prometheus_client's registry.

The series live on the default registry for the whole test process, so each
test reads how much a series moved, not its value.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
import redis
from django.core.checks import Error
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock import locked, locks, rlock
from django_rlock._checks import check_lock_settings
from django_rlock.backends.redis import RedisLockBackend
from django_rlock.core._protocol.holds import Hold
from django_rlock.core._sync import watchdog
from django_rlock.core.exceptions import LockLostError, LockTimeout
from django_rlock.exceptions import LockSettingError
from tests.children import python_module
from tests.django.conftest import HANG, Holders

ROOT = Path(__file__).resolve().parents[2]
PLAIN = "-"  # the lock label of a lock named directly


@pytest.fixture
def metrics_on(settings: SettingsWrapper) -> None:
    settings.RLOCK_METRICS = "prometheus"


def value(name: str, labels: dict[str, str], registry: CollectorRegistry = REGISTRY) -> float:
    """A sample's value, 0 when the series does not exist yet."""
    found = registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


class Reading:
    """The series of one alias and lock label, read before and after something happens."""

    def __init__(self, alias: str, lock: str) -> None:
        self.labels = {"alias": alias, "lock": lock}
        self.start = self.now()

    def now(self) -> dict[str, float]:
        per_lock = {
            "wait": value("django_rlock_wait_seconds_count", self.labels),
            "hold": value("django_rlock_hold_seconds_count", self.labels),
            "lost": value("django_rlock_lost_total", self.labels),
            "held": value("django_rlock_held", self.labels),
        }
        for outcome in ("acquired", "timeout", "busy"):
            labels = {**self.labels, "outcome": outcome}
            per_lock[outcome] = value("django_rlock_acquisitions_total", labels)
        for outcome in ("ok", "failed", "lost"):
            renewals = value("django_rlock_renewals_total", {"outcome": outcome})
            per_lock[f"renewal {outcome}"] = renewals
        return per_lock

    def moved(self) -> dict[str, float]:
        """The series that changed since this reading began, and by how much."""
        now = self.now()
        return {key: now[key] - self.start[key] for key in now if now[key] != self.start[key]}


@pytest.mark.usefixtures("metrics_on")
@pytest.mark.parametrize("alias", ["default", "mem"])
def test_an_acquire_and_release_count_once_under_the_plain_label(alias: str) -> None:
    reading = Reading(alias, PLAIN)
    with rlock("plain", using=alias), rlock("plain", using=alias):  # a re-entry is no acquisition
        assert reading.moved() == {"acquired": 1, "wait": 1, "held": 1}
    assert reading.moved() == {"acquired": 1, "wait": 1, "hold": 1}


@pytest.mark.usefixtures("metrics_on")
def test_locked_counts_under_its_key_template_sync_and_async() -> None:
    reading = Reading("default", "order:{order_id}")
    plain = Reading("default", PLAIN)

    @locked("order:{order_id}")
    def pay(order_id: int) -> dict[str, float]:
        return reading.moved()

    @locked("order:{order_id}", using="default")
    async def refund(order_id: int) -> dict[str, float]:
        return reading.moved()

    assert pay(1) == {"acquired": 1, "wait": 1, "held": 1}
    assert pay(2) == {"acquired": 2, "wait": 2, "hold": 1, "held": 1}
    assert asyncio.run(refund(3)) == {"acquired": 3, "wait": 3, "hold": 2, "held": 1}
    assert reading.moved() == {"acquired": 3, "wait": 3, "hold": 3}
    assert plain.moved() == {}  # never the raw names order:1, order:2, order:3


@pytest.mark.usefixtures("metrics_on")
def test_a_wait_that_runs_out_is_a_timeout_and_a_single_attempt_is_busy(
    hold_elsewhere: Holders,
) -> None:
    hold_elsewhere("taken")
    reading = Reading("default", PLAIN)
    with pytest.raises(LockTimeout):
        rlock("taken", timeout=0.05).__enter__()
    assert reading.moved() == {"timeout": 1, "wait": 1}
    assert not rlock("taken").acquire(blocking=False)
    assert not rlock("taken").acquire(timeout=0)  # one attempt too: nothing was waited for
    assert reading.moved() == {"timeout": 1, "busy": 2, "wait": 3}


@pytest.fixture
def short_watchdog(settings: SettingsWrapper, rlocks: dict[str, Any]) -> None:
    settings.RLOCKS = {**rlocks, "default": {**rlocks["default"], "WATCHDOG_TIMEOUT": 0.6}}


@pytest.fixture
def three_second_watchdog(settings: SettingsWrapper, rlocks: dict[str, Any]) -> None:
    # Renewals every 1 s, each call given at most 0.5 s (core.defaults).
    settings.RLOCKS = {**rlocks, "default": {**rlocks["default"], "WATCHDOG_TIMEOUT": 3.0}}


def renewal_seen(outcome: str) -> Iterator[threading.Event]:
    """An event set after the metrics counted a renewal with ``outcome``.

    Subscribed after the metrics' own callback (made when the series were), so
    it runs after it on the watchdog thread.
    """
    seen = threading.Event()

    def on_renewal(hold: Hold, renewed: watchdog.RenewalOutcome) -> None:
        if renewed == outcome:
            seen.set()

    watchdog.on_renewal(on_renewal)
    try:
        yield seen
    finally:
        watchdog.remove_on_renewal(on_renewal)


@pytest.fixture
def renewed_ok() -> Iterator[threading.Event]:
    yield from renewal_seen("ok")


@pytest.fixture
def renewal_failed() -> Iterator[threading.Event]:
    yield from renewal_seen("failed")


@pytest.mark.usefixtures("metrics_on", "short_watchdog")
def test_a_key_deleted_behind_the_holder_counts_a_renewal_and_a_loss(
    r: redis.Redis, renewed_ok: threading.Event
) -> None:
    lock = rlock("watched")
    backend = locks["default"]
    assert isinstance(backend, RedisLockBackend)
    registry = backend.client.holds
    lost = threading.Event()
    registry.on_lost(lambda hold: lost.set())  # after the metrics' own callback
    reading = Reading("default", PLAIN)
    lock.acquire()
    try:
        assert renewed_ok.wait(HANG)
        assert reading.moved()["renewal ok"] >= 1
        r.delete(*r.keys("t:{watched}*"))
        assert lost.wait(HANG)
        moved = reading.moved()
        assert moved["lost"] == 1
        assert moved["renewal lost"] == 1
    finally:
        with pytest.raises(LockLostError):
            lock.release()  # acknowledges the loss
    moved = reading.moved()
    assert (moved["acquired"], moved["hold"], moved.get("held", 0)) == (1, 1, 0)


@pytest.mark.usefixtures("metrics_on", "three_second_watchdog")
def test_a_renewal_the_server_does_not_answer_in_time_counts_as_failed(
    r: redis.Redis, renewal_failed: threading.Event
) -> None:
    reading = Reading("default", PLAIN)
    with rlock("paused"):
        # The first renewal, 1 s in, waits out the pause and gives up at 1.5 s;
        # the pause ends at 1.7 s, before the retry at 2 s, and the key (3 s)
        # lives on. (With a 0.6 s timeout and a 0.5 s pause the retries ran
        # into the deadline under load: the oldest line lost the lock once.)
        r.client_pause(1700)
        assert renewal_failed.wait(HANG)
    assert reading.moved()["renewal failed"] >= 1


def test_metrics_are_off_by_default_and_nothing_is_subscribed() -> None:
    backend = locks["default"]
    assert backend.reporter.metrics is None
    reading = Reading("default", PLAIN)
    with rlock("quiet"):
        pass
    assert reading.moved() == {}


def test_metrics_off_never_import_prometheus_client(redis_url: str) -> None:
    with holder(redis_url, "1", "off", {}) as process:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "held False"


@pytest.mark.parametrize(
    ("value_", "message"),
    [
        ("statsd", "RLOCK_METRICS must be None or one of 'prometheus', got 'statsd'"),
        (True, "RLOCK_METRICS must be None or one of 'prometheus', got True"),
    ],
)
def test_a_bad_rlock_metrics_is_a_clear_error(
    settings: SettingsWrapper, value_: object, message: str
) -> None:
    settings.RLOCK_METRICS = value_
    with pytest.raises(LockSettingError, match=message):
        locks["default"]
    errors = check_lock_settings()
    assert [(error.id, error.msg) for error in errors] == [("django_rlock.E008", message)]
    assert all(isinstance(error, Error) for error in errors)


def test_rlock_metrics_without_prometheus_client_names_the_extra(tmp_path: Path) -> None:
    # A prometheus_client that cannot be imported, first on the path.
    (tmp_path / "prometheus_client.py").write_text("raise ImportError('not installed here')\n")
    code = (
        "import django; from django.conf import settings\n"
        "settings.configure(RLOCK_METRICS='prometheus', INSTALLED_APPS=['django_rlock'])\n"
        "django.setup()\n"
        "from django_rlock._checks import check_lock_settings\n"
        "print([(e.id, e.msg) for e in check_lock_settings()])\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "django_rlock.E008" in out.stdout
    assert "needs prometheus_client, which is not installed" in out.stdout
    assert "pip install 'django-rlock[prometheus]'" in out.stdout


def holder(
    url: str, order_id: str, metrics: str, env: dict[str, str]
) -> AbstractContextManager[subprocess.Popen[str]]:
    """A ``tests.django.metrics_holder`` process, ended (its lock released) on exit."""
    inherited = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    return python_module(
        "tests.django.metrics_holder",
        *(url, order_id, metrics),
        stdin=True,
        cwd=ROOT,
        env={**inherited, "PYTHONPATH": str(ROOT), **env},
    )


def release(process: subprocess.Popen[str]) -> None:
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write("release\n")
    process.stdin.flush()
    assert process.stdout.readline().strip() == "released"
    assert process.wait(HANG) == 0


def test_two_processes_sum_in_multiprocess_mode(redis_url: str, tmp_path: Path) -> None:
    """Like two gunicorn workers: each writes its own files, the collector serves the sum."""
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    template = {"alias": "default", "lock": "order:{order_id}"}

    def read(name: str, **labels: str) -> float:
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(tmp_path))  # type: ignore[no-untyped-call]  # untyped upstream
        return value(name, {**template, **labels}, registry)

    with (
        holder(redis_url, "1", "prometheus", env) as one,
        holder(redis_url, "2", "prometheus", env) as two,
    ):
        for process in (one, two):
            assert process.stdout is not None
            assert process.stdout.readline().strip() == "held True"
        assert read("django_rlock_acquisitions_total", outcome="acquired") == 2
        assert read("django_rlock_held") == 2
        release(one)
        assert read("django_rlock_held") == 1
        assert read("django_rlock_hold_seconds_count") == 1
        # A worker killed while holding: its gauge leaves the sum once it is
        # marked dead (gunicorn's child_exit hook does this).
        two.kill()
        assert two.wait(HANG) != 0
        assert read("django_rlock_held") == 1
        mark_process_dead(two.pid, str(tmp_path))  # type: ignore[no-untyped-call]  # untyped upstream
        assert read("django_rlock_held") == 0
        assert read("django_rlock_acquisitions_total", outcome="acquired") == 2
