"""``@rate_limited`` views (429 with an honest Retry-After, 503), ``locks[a].rate_limiter``,
the throttled metric and ``manage.py rlock inspect`` of a limiter."""

from __future__ import annotations

import asyncio
import io
import json
import time
from typing import Any

import pytest
from django.core.management import call_command
from django.test import AsyncClient, Client
from prometheus_client import REGISTRY
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock import (
    LockTimeout,
    LockUnavailableError,
    RateLimitExceeded,
    locks,
    rate_limited,
)
from django_rlock._aliaslimiters import ThreadRateLimiter
from django_rlock.backends.base import BaseLockBackend
from tests.django import ratelimit_views
from tests.servers import free_port

pytestmark = pytest.mark.urls("tests.django.ratelimit_views")

HANG = 30.0


@pytest.fixture(autouse=True)
def forget_runs() -> None:
    ratelimit_views.RAN.clear()


def test_a_view_over_its_limit_answers_429_with_an_honest_retry_after() -> None:
    client = Client()
    assert [client.get("/login/alice/").status_code for _ in range(2)] == [200, 200]
    refused = client.get("/login/alice/")
    assert refused.status_code == 429
    # 2/m: the next permit is due 30 s after the burst, rounded up to whole seconds.
    assert refused["Retry-After"] == "30"
    assert b"alice" not in refused.content and b"login" not in refused.content
    assert ratelimit_views.RAN == {"login alice": 2}  # the refused call did not run
    # Each key has its own limit.
    assert client.get("/login/bob/").status_code == 200


def test_a_client_that_waits_as_told_gets_in() -> None:
    client = Client()
    assert client.get("/poll/carol/").status_code == 200
    refused = client.get("/poll/carol/")
    assert refused.status_code == 429
    limiter = locks["default"].rate_limiter("poll:carol", "2/s", burst=1)
    wait = limiter.wait_time()
    assert 0 < wait <= 0.5
    assert refused["Retry-After"] == "1"  # at least one whole second
    time.sleep(wait)  # refusals took nothing: the permit is due as promised
    assert client.get("/poll/carol/").status_code == 200
    assert ratelimit_views.RAN == {"poll carol": 2}


def test_an_async_view_and_a_class_based_view() -> None:
    async def scenario() -> list[int]:
        client = AsyncClient()
        return [
            (await asyncio.wait_for(client.get("/search/dan/"), HANG)).status_code for _ in range(3)
        ]

    assert asyncio.run(scenario()) == [200, 200, 429]
    client = Client()
    assert [client.get("/export/7/").status_code for _ in range(2)] == [200, 429]
    assert client.get("/export/8/").status_code == 200
    assert ratelimit_views.RAN == {"search dan": 2, "export 7": 1, "export 8": 1}


def test_an_unreachable_lock_server_answers_503(
    settings: SettingsWrapper, rlocks: dict[str, Any]
) -> None:
    settings.RLOCKS = {
        **rlocks,
        "default": {"LOCATION": f"redis://127.0.0.1:{free_port()}/0", "KEY_PREFIX": "t"},
    }
    response = Client().get("/login/erin/")
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert ratelimit_views.RAN == {}

    @rate_limited("job:{n}", "1/m")
    def job(n: int) -> int:
        return n

    with pytest.raises(LockUnavailableError, match="rate limiter 'job:1'"):
        job(1)


def test_a_function_that_is_not_a_view_raises_rate_limit_exceeded() -> None:
    @rate_limited("job:{n}", "1/m", using="mem")
    def job(n: int) -> int:
        return n

    assert job(1) == 1
    over = r"rate limit 1/m \(burst 1\) of 'job:1' reached"
    with pytest.raises(RateLimitExceeded, match=over) as e:
        job(1)
    assert isinstance(e.value, LockTimeout)  # what callers of any lock wait already catch
    assert e.value.retry_after is not None and 59 < e.value.retry_after <= 60
    assert job(2) == 2


def test_a_rate_limited_helper_inside_a_view_answers_429_through_the_middleware(
    settings: SettingsWrapper,
) -> None:
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django_rlock.middleware.LockErrorMiddleware"]
    client = Client()
    assert client.get("/report/ann/").status_code == 200
    refused = client.get("/report/ann/")
    assert refused.status_code == 429  # a rate limit, not a busy lock's 409
    assert refused["Retry-After"] == "60"  # 59.9... s rounded up
    assert ratelimit_views.RAN == {"report ann": 1}


def test_bad_arguments_are_refused_when_decorating() -> None:
    with pytest.raises(ValueError, match="at least 1 permit"):
        rate_limited("job:{n}", "0/s")
    with pytest.raises(ValueError, match="burst must be an int >= 1"):
        rate_limited("job:{n}", "5/s", burst=0)
    with pytest.raises(ValueError, match="has no parameter 'n'"):
        rate_limited("job:{n}", "5/s")(lambda m: m)


def test_throttled_calls_are_counted_per_key_template(settings: SettingsWrapper) -> None:
    settings.RLOCK_METRICS = "prometheus"

    def throttled(outcome: str, template: str = "login:{username}") -> float:
        labels = {"alias": "default", "limiter": template, "outcome": outcome}
        return REGISTRY.get_sample_value("django_rlock_throttled_total", labels) or 0.0

    before = throttled("refused")
    client = Client()
    assert [client.get("/login/frank/").status_code for _ in range(4)] == [200, 200, 429, 429]
    assert throttled("refused") - before == 2

    # A limiter named directly counts under "-"; a wait counts as delayed.
    direct, delayed = throttled("refused", "-"), throttled("delayed", "-")
    refusing = locks["default"].rate_limiter("direct", "1/m", burst=1)
    assert refusing.try_acquire()
    assert not refusing.try_acquire()
    delaying = locks["default"].rate_limiter("paced", "2/s", burst=1)
    assert delaying.try_acquire()
    assert delaying.acquire(timeout=HANG)  # waits about 0.5 s
    assert throttled("refused", "-") - direct == 1
    assert throttled("delayed", "-") - delayed == 1


@pytest.mark.parametrize("alias", ["default", "mem"])
def test_rlock_inspect_shows_a_limiters_state(alias: str) -> None:
    def inspect(*args: str) -> str:
        out = io.StringIO()
        call_command("rlock", "inspect", "api:1", "--using", alias, *args, stdout=out)
        return out.getvalue()

    assert "api:1" in inspect() and "Rate limiter" not in inspect()
    assert json.loads(inspect("--json")) == {"name": "api:1", "held": False}
    assert locks[alias].rate_limiter("api:1", "10/m").try_acquire(3)
    shown = json.loads(inspect("--json"))["rate_limiter"]
    assert shown["rate"] == "10/m" and shown["burst"] == 10
    assert shown["available"] == 7 and shown["next_in"] == 0.0
    assert 17 < shown["full_in"] <= 18
    text = inspect()
    assert "Lock 'api:1' is free." in text
    assert "Rate limiter 'api:1': 10/m, burst 10." in text
    assert "available: 7 of 10" in text


def test_an_alias_without_the_asyncio_engine_runs_its_limiter_on_threads() -> None:
    # What a cache alias, Sentinel or Cluster hands async code: the sync limiter, on threads.
    limiter = BaseLockBackend.async_rate_limiter(locks["default"], "threaded", "1/m")
    assert isinstance(limiter, ThreadRateLimiter)
    limiter.key_template = "threaded"

    async def scenario() -> tuple[bool, bool, float, bool]:
        return (
            await limiter.try_acquire(),
            await limiter.acquire(timeout=1),
            await limiter.wait_time(),
            await locks["default"].async_rate_limiter("threaded", "1/m").try_acquire(),
        )

    granted, waited, wait, native = asyncio.run(scenario())
    assert (granted, waited, native) == (True, False, False)
    assert 59 < wait <= 60
