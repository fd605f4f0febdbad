"""Deadlocks in the Django face: RLOCK_DEADLOCK_TIMEOUT, the lock_deadlock signal, the log."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.test import Client, RequestFactory
from prometheus_client import REGISTRY
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock import DeadlockError, locked, locks, rlock
from django_rlock.backends.redis import RedisLockBackend
from django_rlock.core import LockClient
from django_rlock.exceptions import LockSettingError
from django_rlock.signals import lock_deadlock
from tests.django.conftest import HANG, Heard
from tests.threads import run_to_end


def client_of(alias: str) -> LockClient:
    backend = locks[alias]
    assert isinstance(backend, RedisLockBackend)
    return backend.client


def opposite_order(using: str = "default") -> list[str]:
    """Two threads lock ``a`` and ``b`` in opposite order; their outcomes."""
    both_hold = threading.Barrier(2)
    outcomes: list[str] = []

    def member(first: str, second: str) -> None:
        with rlock(first, using=using):
            both_hold.wait(HANG)
            try:
                with rlock(second, using=using):
                    outcomes.append("granted")
            except DeadlockError:
                outcomes.append("deadlock")

    threads = [
        threading.Thread(target=member, args=("a", "b")),
        threading.Thread(target=member, args=("b", "a")),
    ]
    run_to_end(threads, HANG)
    return sorted(outcomes)


@pytest.mark.parametrize("alias", ["default", "mem"])
def test_a_deadlock_is_broken_signalled_and_logged(
    settings: SettingsWrapper, caplog: pytest.LogCaptureFixture, alias: str
) -> None:
    settings.RLOCK_DEADLOCK_TIMEOUT = 0.3
    heard = Heard()
    lock_deadlock.connect(heard, weak=False)
    try:
        with caplog.at_level(logging.WARNING, logger="django_rlock.lock"):
            assert opposite_order(alias) == ["deadlock", "granted"]
    finally:
        lock_deadlock.disconnect(heard)
    assert len(heard.calls) == 1
    call: dict[str, Any] = heard.calls[0]
    assert call["alias"] == alias
    assert call["name"] in ("a", "b")
    assert isinstance(call["error"], DeadlockError)
    assert [entry["lock"] for entry in call["cycle"]] == [
        call["name"],
        "b" if call["name"] == "a" else "a",
    ]
    assert call["waited"] > 0.3
    logged = [record.getMessage() for record in caplog.records if "deadlock" in record.getMessage()]
    assert len(logged) == 1
    assert logged[0].startswith("deadlock detected") and f"(alias {alias!r})" in logged[0]


def test_the_setting_reaches_the_client_per_alias_or_globally(
    settings: SettingsWrapper, rlocks: dict[str, Any]
) -> None:
    assert client_of("default").deadlock_timeout == 1.0  # the default, PostgreSQL's
    locks.close_all()
    settings.RLOCK_DEADLOCK_TIMEOUT = None
    assert client_of("default").deadlock_timeout is None
    locks.close_all()
    settings.RLOCKS = {**rlocks, "default": {**rlocks["default"], "DEADLOCK_TIMEOUT": 0.25}}
    assert client_of("default").deadlock_timeout == 0.25


@pytest.mark.parametrize("value", [0, -1, "1", True, float("nan")])
def test_a_bad_setting_is_refused_naming_it(settings: SettingsWrapper, value: object) -> None:
    settings.RLOCK_DEADLOCK_TIMEOUT = value
    with pytest.raises(LockSettingError, match=r"RLOCK_DEADLOCK_TIMEOUT.*deadlock_timeout"):
        locks["default"].lock("x")


# -- the faces: a view's answer, the metric ---------------------------------------------------


@locked("{name}")
def locked_view(request: HttpRequest, name: str) -> HttpResponse:
    return HttpResponse("done")


@locked("{name}")
async def async_locked_view(request: HttpRequest, name: str) -> HttpResponse:
    return HttpResponse("done")


def assert_busy_answer(responses: Sequence[HttpResponseBase]) -> HttpResponseBase:
    """One 409 with a Retry-After, one 200; the 409, whose body names no lock."""
    assert sorted(response.status_code for response in responses) == [200, 409]
    busy = next(response for response in responses if response.status_code == 409)
    assert int(busy["Retry-After"]) >= 1
    assert isinstance(busy, HttpResponse)
    assert b"dl:" not in busy.content and b"'a'" not in busy.content
    return busy


def assert_cycle_logged(caplog: pytest.LogCaptureFixture, *names: str) -> None:
    """One WARNING on django_rlock.lock naming every lock of the cycle and its holder."""
    logged = [
        record.getMessage()
        for record in caplog.records
        if record.name == "django_rlock.lock" and "deadlock detected" in record.getMessage()
    ]
    assert len(logged) == 1, logged
    for name in names:
        assert f"lock {name!r} held by {socket.gethostname()} pid " in logged[0]


def test_a_locked_view_answers_its_deadlock_as_a_busy_lock(
    settings: SettingsWrapper, rf: RequestFactory, caplog: pytest.LogCaptureFixture
) -> None:
    settings.RLOCK_DEADLOCK_TIMEOUT = 0.3
    both_hold = threading.Barrier(2)
    responses: list[HttpResponse] = []

    def member(first: str, second: str) -> None:
        with rlock(first):
            both_hold.wait(HANG)
            responses.append(locked_view(rf.get("/"), second))

    threads = [
        threading.Thread(target=member, args=("a", "b")),
        threading.Thread(target=member, args=("b", "a")),
    ]
    with caplog.at_level(logging.WARNING, logger="django_rlock.lock"):
        run_to_end(threads, HANG)
    assert_busy_answer(responses)
    assert_cycle_logged(caplog, "a", "b")


def test_an_async_locked_view_answers_its_deadlock_as_a_busy_lock(
    settings: SettingsWrapper, rf: RequestFactory
) -> None:
    settings.RLOCK_DEADLOCK_TIMEOUT = 0.3

    async def scenario() -> list[HttpResponse]:
        both_hold = asyncio.Barrier(2)

        async def member(first: str, second: str) -> HttpResponse:
            async with locks["default"].async_lock(first):
                await both_hold.wait()
                return await async_locked_view(rf.get("/"), second)

        together = asyncio.gather(member("a", "b"), member("b", "a"))
        return list(await asyncio.wait_for(together, HANG))

    assert_busy_answer(asyncio.run(scenario()))


def requests_in_opposite_order(path: str) -> list[HttpResponseBase]:
    """``path`` (``.../{run}/{first}/{second}/``) for a/b and b/a at once, each on its thread."""
    run = uuid.uuid4().hex[:8]
    responses: list[HttpResponseBase] = []

    def call(first: str, second: str) -> None:
        responses.append(Client().get(path.format(run=run, first=first, second=second)))

    threads = [
        threading.Thread(target=call, args=("a", "b")),
        threading.Thread(target=call, args=("b", "a")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HANG + 30)  # the views' rendezvous waits up to 30 s for a partner
        assert not thread.is_alive()
    return responses


@pytest.mark.urls("tests.django.deadlock_urls")
def test_the_middleware_answers_a_deadlock_in_a_view_as_a_busy_lock(
    settings: SettingsWrapper, caplog: pytest.LogCaptureFixture
) -> None:
    settings.RLOCK_DEADLOCK_TIMEOUT = 0.3
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django_rlock.middleware.LockErrorMiddleware"]
    with caplog.at_level(logging.WARNING, logger="django_rlock.lock"):
        responses = requests_in_opposite_order("/transfer/{run}/{first}/{second}/")
    assert_busy_answer(responses)
    assert_cycle_logged(caplog)


@pytest.mark.urls("tests.django.deadlock_urls")
def test_a_locked_function_of_the_view_answers_a_deadlock_without_the_middleware(
    settings: SettingsWrapper,
) -> None:
    settings.RLOCK_DEADLOCK_TIMEOUT = 0.3
    assert_busy_answer(requests_in_opposite_order("/transfer-locked/{run}/{first}/{second}/"))


@pytest.mark.urls("tests.django.deadlock_urls")
def test_busy_response_applies_to_a_deadlock(settings: SettingsWrapper) -> None:
    settings.RLOCK_DEADLOCK_TIMEOUT = 0.3
    settings.RLOCK_BUSY_RESPONSE = 423
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django_rlock.middleware.LockErrorMiddleware"]
    for path in ("/transfer/{run}/{first}/{second}/", "/transfer-locked/{run}/{first}/{second}/"):
        statuses = [response.status_code for response in requests_in_opposite_order(path)]
        assert sorted(statuses) == [200, 423]


def test_a_broken_deadlock_counts_in_django_rlock_deadlocks_total(
    settings: SettingsWrapper,
) -> None:
    settings.RLOCK_METRICS = "prometheus"
    settings.RLOCK_DEADLOCK_TIMEOUT = 0.3

    def counted(name: str, **labels: str) -> float:
        found = REGISTRY.get_sample_value(name, {"alias": "default", **labels})
        return 0.0 if found is None else found

    labels = {"lock": "pair:{side}"}
    before = counted("django_rlock_deadlocks_total", **labels)
    outcome = counted("django_rlock_acquisitions_total", **labels, outcome="deadlock")
    both_hold = threading.Barrier(2)
    outcomes: list[str] = []

    def member(first: str, second: str) -> None:
        with rlock("pair:{side}", side=first):
            both_hold.wait(HANG)
            try:
                with rlock("pair:{side}", side=second):
                    outcomes.append("granted")
            except DeadlockError:
                outcomes.append("deadlock")

    threads = [
        threading.Thread(target=member, args=("a", "b")),
        threading.Thread(target=member, args=("b", "a")),
    ]
    run_to_end(threads, HANG)
    assert sorted(outcomes) == ["deadlock", "granted"]
    assert counted("django_rlock_deadlocks_total", **labels) == before + 1
    after = counted("django_rlock_acquisitions_total", **labels, outcome="deadlock")
    assert after == outcome + 1
