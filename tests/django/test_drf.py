"""``@locked`` on Django REST framework views: 409 when busy, 503 when unreachable, never 500.

DRF hands its views its own ``Request``, which is not a Django ``HttpRequest``;
``@locked`` took such a view for a plain function and let ``LockTimeout``
reach Django: a 500 unless ``LockErrorMiddleware`` was installed. Each view
of tests/django/drf_views.py is called through Django's test client, with
and without the middleware, with its lock free, busy, and on an unreachable
server.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import Client
from pytest_django.fixtures import Settings as SettingsWrapper
from rest_framework.request import Request  # type: ignore[import-untyped]  # DRF has no hints

from django_rlock.exceptions import LockTimeout
from tests.django.conftest import Holders
from tests.servers import free_port

pytestmark = pytest.mark.urls("tests.django.drf_urls")

MIDDLEWARE = "django_rlock.middleware.LockErrorMiddleware"

#: (HTTP method, path) of each view, for order 7.
VIEWS = [
    pytest.param("post", "/api-view/7/", id="api_view"),
    pytest.param("post", "/api-view-outside/7/", id="api_view-under-locked"),
    pytest.param("post", "/apiview/7/", id="APIView-method"),
    pytest.param("post", "/decorated/7/", id="APIView-method_decorator"),
    pytest.param("get", "/viewset/7/", id="ViewSet-action"),
    pytest.param("put", "/viewset/7/", id="ViewSet-method_decorator"),
]


@pytest.fixture(params=[False, True], ids=["without-middleware", "with-middleware"])
def middleware(request: pytest.FixtureRequest, settings: SettingsWrapper) -> bool:
    if request.param:
        settings.MIDDLEWARE = [*settings.MIDDLEWARE, MIDDLEWARE]
    return bool(request.param)


def call(method: str, path: str) -> Any:
    """The view's answer; a view that fails answers 500 (it is not raised into the test)."""
    client = Client(raise_request_exception=False)
    if method == "get":
        return client.get(path)
    return getattr(client, method)(
        path, data=json.dumps({"amount": 1}), content_type="application/json"
    )


@pytest.mark.parametrize(("method", "path"), VIEWS)
@pytest.mark.usefixtures("middleware")
def test_a_free_lock_runs_the_view(method: str, path: str) -> None:
    response = call(method, path)
    assert response.status_code == 200, response.content
    assert json.loads(response.content)["ok"] == 7


@pytest.mark.parametrize(("method", "path"), VIEWS)
@pytest.mark.usefixtures("middleware")
def test_a_busy_lock_answers_409_with_retry_after(
    method: str, path: str, hold_elsewhere: Holders
) -> None:
    hold_elsewhere("order:7", lease=20)  # just taken: held for well under a second
    response = call(method, path)
    assert response.status_code == 409, response.content
    assert response["Retry-After"] == "1"  # the holder's time so far, not its 20 s lease
    assert b"order" not in response.content


@pytest.fixture
def unreachable(settings: SettingsWrapper, rlocks: dict[str, Any]) -> None:
    """RLOCKS['default'] on a loopback port nothing listens on."""
    settings.RLOCKS = {**rlocks, "default": {"LOCATION": f"redis://127.0.0.1:{free_port()}/0"}}


@pytest.mark.parametrize(("method", "path"), VIEWS)
@pytest.mark.usefixtures("middleware", "unreachable")
def test_an_unreachable_lock_server_answers_503(method: str, path: str) -> None:
    response = call(method, path)
    assert response.status_code == 503, response.content
    assert response["Retry-After"] == "5"
    assert b"127.0.0.1" not in response.content


def test_a_busy_response_callable_gets_the_views_own_request(
    settings: SettingsWrapper, hold_elsewhere: Holders
) -> None:
    """The callable is given what the view is given: DRF's Request, with its parsed data."""
    seen: list[object] = []

    def answer(request: HttpRequest, error: LockTimeout) -> HttpResponse:
        seen.append(request)
        return HttpResponse(f"busy {request.data['amount']}", status=423)  # type: ignore[attr-defined]  # DRF's Request

    settings.RLOCK_BUSY_RESPONSE = answer
    hold_elsewhere("order:7", lease=20)
    response = call("post", "/api-view/7/")
    assert (response.status_code, response.content) == (423, b"busy 1")
    assert isinstance(seen[0], Request)


def test_busy_response_raise_lets_drf_see_the_error(
    settings: SettingsWrapper, hold_elsewhere: Holders
) -> None:
    settings.RLOCK_BUSY_RESPONSE = "raise"
    hold_elsewhere("order:7", lease=20)
    with pytest.raises(LockTimeout):
        Client().post("/api-view/7/", data="{}", content_type="application/json")
