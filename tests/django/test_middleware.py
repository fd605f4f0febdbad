"""LockErrorMiddleware: a view's ``rlock()`` errors answer 409, 503 or 400, never 500.

The views (tests/django/middleware_views.py) take their locks with ``rlock()``
inside the view, as user code does; another thread holds the lock when a test
wants it busy.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
import redis
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, Client
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock import InvalidLockNameError, LockTimeout, LockUnavailableError
from django_rlock._handler import locks
from tests.django.conftest import Holders
from tests.servers import free_port

pytestmark = pytest.mark.urls("tests.django.middleware_urls")

MIDDLEWARE = "django_rlock.middleware.LockErrorMiddleware"


@pytest.fixture(autouse=True)
def middleware(settings: SettingsWrapper) -> None:
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, MIDDLEWARE]


def _async_get(path: str) -> Any:
    return asyncio.run(AsyncClient().get(path))


def test_a_busy_rlock_answers_409_with_the_holders_time_not_its_lease(
    hold_elsewhere: Holders,
) -> None:
    hold_elsewhere("order:1", lease=20)  # just taken: held for well under a second
    response = Client().get("/order/1/")
    assert response.status_code == 409
    assert response["Retry-After"] == "1"  # not the 20 s lease
    assert b"order:1" not in response.content


def test_a_busy_async_rlock_answers_409(hold_elsewhere: Holders) -> None:
    hold_elsewhere("order:2", lease=20)
    response = _async_get("/async-order/2/")
    assert response.status_code == 409
    assert response["Retry-After"] == "1"


def test_a_free_lock_runs_the_view(r: redis.Redis) -> None:
    assert Client().get("/order/3/").content == b"ok"
    assert _async_get("/async-order/3/").content == b"ok"


def test_without_the_middleware_the_timeout_reaches_django(
    settings: SettingsWrapper, hold_elsewhere: Holders
) -> None:
    settings.MIDDLEWARE = [item for item in settings.MIDDLEWARE if item != MIDDLEWARE]
    hold_elsewhere("order:4")
    with pytest.raises(LockTimeout):
        Client().get("/order/4/")


def test_the_aliass_busy_response_applies(
    settings: SettingsWrapper, rlocks: dict[str, Any], hold_elsewhere: Holders
) -> None:
    settings.RLOCKS = {**rlocks, "mem": {**rlocks["mem"], "BUSY_RESPONSE": 423}}
    hold_elsewhere("order:5", using="mem", lease=20)
    busy = Client().get("/mem-order/5/")
    assert busy.status_code == 423
    assert busy["Retry-After"] == "1"  # the LocMem alias's holder is read too
    hold_elsewhere("order:5", lease=20)
    assert Client().get("/order/5/").status_code == 409  # the default alias: its own setting

    settings.RLOCK_BUSY_RESPONSE = "tests.django.test_middleware.teapot"
    assert Client().get("/order/5/").status_code == 418
    settings.RLOCK_BUSY_RESPONSE = "raise"
    with pytest.raises(LockTimeout):
        Client().get("/order/5/")


def teapot(request: HttpRequest, error: Exception) -> HttpResponse:
    assert isinstance(error, LockTimeout) and error.retry_after == 1
    return HttpResponse("busy", status=418)


def test_a_busy_semaphore_answers_409_with_the_lease_left() -> None:
    holders = Holders()
    try:
        holders.keep(lambda: locks["default"].semaphore("partner:1", 1, lease=20), "a permit")
        response = Client().get("/partner/1/")
    finally:
        holders.close()
    assert response.status_code == 409
    # A semaphore's holders are not read: with no history, the lease left bounds the wait.
    assert 15 <= int(response["Retry-After"]) <= 20


@pytest.mark.parametrize("path", ["/page/a%0Ab/", "/async-page/a%0Ab/", "/locked-page/a%0Ab/"])
def test_a_name_with_a_control_character_from_the_url_answers_400(
    path: str, caplog: pytest.LogCaptureFixture, r: redis.Redis
) -> None:
    with caplog.at_level(logging.WARNING, logger="django_rlock.lock"):
        response = _async_get(path) if path.startswith("/async") else Client().get(path)
    assert response.status_code == 400
    assert "Retry-After" not in response
    assert b"page:" not in response.content  # the name is not echoed
    assert any("control characters" in record.getMessage() for record in caplog.records)
    assert r.dbsize() == 0


def test_without_the_middleware_a_bad_name_reaches_django(settings: SettingsWrapper) -> None:
    settings.MIDDLEWARE = [item for item in settings.MIDDLEWARE if item != MIDDLEWARE]
    with pytest.raises(InvalidLockNameError, match="control characters"):
        Client().get("/page/a%0Ab/")


@pytest.fixture
def unreachable(settings: SettingsWrapper, rlocks: dict[str, Any]) -> None:
    """RLOCKS['default'] on a loopback port nothing listens on."""
    settings.RLOCKS = {**rlocks, "default": {"LOCATION": f"redis://127.0.0.1:{free_port()}/0"}}


@pytest.mark.parametrize("path", ["/order/6/", "/async-order/6/"])
@pytest.mark.usefixtures("unreachable")
def test_an_unreachable_lock_server_answers_503(
    path: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="django_rlock.lock"):
        response = _async_get(path) if path.startswith("/async") else Client().get(path)
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert b"127.0.0.1" not in response.content
    assert any("RLOCKS['default']" in record.getMessage() for record in caplog.records)


@pytest.mark.usefixtures("unreachable")
def test_an_unreachable_server_is_raised_when_the_alias_says_raise(
    settings: SettingsWrapper,
) -> None:
    settings.RLOCK_BUSY_RESPONSE = "raise"
    with pytest.raises(LockUnavailableError):
        Client().get("/order/7/")


def test_other_errors_pass_through() -> None:
    with pytest.raises(ValueError, match="not a lock error"):
        Client().get("/broken/")
