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
    LockSettingError,
    LockTimeout,
    LockUnavailableError,
    RateLimitExceeded,
    locks,
    rate_limited,
)
from django_rlock.backends._ratelimiters import ThreadRateLimiter
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
    # The same answer a @rate_limited view gives: JSON when the client asks for it.
    as_json = client.get("/report/ann/", HTTP_ACCEPT="application/json")
    assert as_json.status_code == 429
    assert as_json["Content-Type"] == "application/json"
    assert as_json.json()["retry_after"] == int(as_json["Retry-After"])


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


def test_rlock_inspect_shows_the_polite_callers_kept_place() -> None:
    """A refused try_acquire() keeps a place in the queue: inspect shows it and counts it."""

    def inspect(*args: str) -> str:
        out = io.StringIO()
        call_command("rlock", "inspect", "api:place", *args, stdout=out)
        return out.getvalue()

    limiter = locks["default"].rate_limiter("api:place", "10/m")  # one permit per 6 s
    assert limiter.try_acquire(10)  # the whole burst
    assert json.loads(inspect("--json"))["rate_limiter"]["place"] is None
    assert not limiter.try_acquire()  # refused: the polite callers' place is kept, in 6 s
    shown = json.loads(inspect("--json"))["rate_limiter"]
    place = shown["place"]
    assert place["permits"] == 1 and place["booked"] is False
    assert 5 < place["in"] <= 6
    # An acquire() caller goes after the place: its next permit is 12 s away, not 6.
    assert shown["available"] == 0 and 11 < shown["next_in"] <= 12
    text = inspect()
    assert "kept place: 1 permit for the polite callers (try_acquire, wait_time), due in " in text
    assert "not yet counted (acquire() goes after it)" in text


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


# -- key=, method=, block=False, the limited view, JSON (issue 34) ------------------------


def twice(client: Client, path: str, **extra: Any) -> list[int]:
    return [client.get(path, **extra).status_code for _ in range(2)]


def test_key_ip_limits_each_client_address_and_an_ipv6_client_by_its_64() -> None:
    assert twice(Client(REMOTE_ADDR="203.0.113.7"), "/k/ip/") == [200, 429]
    assert twice(Client(REMOTE_ADDR="203.0.113.8"), "/k/ip/") == [200, 429]
    # One IPv6 client holds a /64: its addresses share a limit.
    assert Client(REMOTE_ADDR="2001:db8::1").get("/k/ip/").status_code == 200
    assert Client(REMOTE_ADDR="2001:db8::2").get("/k/ip/").status_code == 429
    assert Client(REMOTE_ADDR="2001:db8:0:1::1").get("/k/ip/").status_code == 200
    assert ratelimit_views.RAN == {"keyed ip": 4}
    # The limit's name, as docs/rate-limits.md gives it (for `rlock inspect`).
    limiter = locks["default"].rate_limiter("k-ip:ip=203.0.113.7", "1/m")
    assert 59 < limiter.wait_time() <= 60


@pytest.mark.django_db
def test_key_user_limits_each_signed_in_user_and_refuses_an_anonymous_one_with_400(
    django_user_model: Any,
) -> None:
    anonymous = Client().get("/k/user/")
    assert anonymous.status_code == 400
    assert b"needs a signed-in user" in anonymous.content
    ann, bob = Client(), Client()
    ann.force_login(django_user_model.objects.create_user("ann"))
    bob.force_login(django_user_model.objects.create_user("bob"))
    assert twice(ann, "/k/user/") == [200, 429]
    assert twice(bob, "/k/user/") == [200, 429]
    # user_or_ip: the user when signed in, else the address.
    assert twice(ann, "/k/user-or-ip/") == [200, 429]
    assert twice(Client(REMOTE_ADDR="198.51.100.1"), "/k/user-or-ip/") == [200, 429]
    assert Client(REMOTE_ADDR="198.51.100.2").get("/k/user-or-ip/").status_code == 200
    assert ratelimit_views.RAN == {"keyed user": 2, "keyed user_or_ip": 3}


def test_key_user_in_an_async_view_reads_the_user_without_blocking_the_loop() -> None:
    async def scenario() -> tuple[int, bytes]:
        response = await asyncio.wait_for(AsyncClient().get("/k/async-user/"), HANG)
        return response.status_code, response.content

    status, body = asyncio.run(scenario())
    assert status == 400 and b"signed-in user" in body  # read through request.auser()


def test_key_header_limits_each_header_value() -> None:
    missing = Client().get("/k/header/")
    assert missing.status_code == 400
    assert b"needs the header 'X-Api-Key'" in missing.content
    assert twice(Client(), "/k/header/", HTTP_X_API_KEY="k1") == [200, 429]
    assert twice(Client(), "/k/header/", HTTP_X_API_KEY="k2") == [200, 429]


def test_key_post_with_method_post_fits_a_login_form() -> None:
    client = Client()
    # GET (the form page) is not limited.
    assert [client.get("/k/post/").status_code for _ in range(3)] == [200] * 3
    missing = client.post("/k/post/", {"password": "x"})
    assert missing.status_code == 400  # the client's error, never a 500
    assert b"needs the form field 'username'" in missing.content
    assert [client.post("/k/post/", {"username": "ann"}).status_code for _ in range(2)] == [
        200,
        429,
    ]
    assert client.post("/k/post/", {"username": "bob"}).status_code == 200
    assert ratelimit_views.RAN == {"keyed GET": 3, "keyed POST": 2}


def test_key_get_with_a_list_of_methods() -> None:
    client = Client()
    assert twice(client, "/k/get/", data={"q": "red"}) == [200, 429]
    assert client.head("/k/get/", {"q": "red"}).status_code == 429  # HEAD is in the list
    assert client.get("/k/get/", {"q": "blue"}).status_code == 200
    assert client.post("/k/get/").status_code == 200  # POST is not limited: no key needed
    assert client.get("/k/get/").status_code == 400


def test_a_callable_key_and_one_that_finds_nothing() -> None:
    assert twice(Client(), "/k/callable/", data={"tenant": "acme"}) == [200, 429]
    assert Client().get("/k/callable/", {"tenant": "globex"}).status_code == 200
    nothing = Client().get("/k/callable/")
    assert nothing.status_code == 400
    assert b"lacks what the rate limit is keyed on" in nothing.content


def test_a_template_keyed_on_a_missing_post_field_answers_400_not_500() -> None:
    client = Client()
    missing = client.post("/form-login/", {"password": "x"})
    assert missing.status_code == 400
    assert b"username" in missing.content
    assert [client.post("/form-login/", {"username": "ann"}).status_code for _ in range(2)] == [
        200,
        429,
    ]
    assert ratelimit_views.RAN == {"form-login ann": 1}


def test_block_false_runs_the_view_with_request_limited() -> None:
    client = Client(REMOTE_ADDR="192.0.2.9")
    assert [client.get("/soft/").content for _ in range(2)] == [
        b"soft limited=False",
        b"soft limited=True",
    ]

    async def scenario() -> list[bytes]:
        aclient = AsyncClient(REMOTE_ADDR="192.0.2.9")
        return [(await asyncio.wait_for(aclient.get("/soft-async/"), HANG)).content for _ in "ab"]

    assert asyncio.run(scenario()) == [b"soft-async limited=False", b"soft-async limited=True"]


def test_the_429_is_json_when_the_request_asks_for_json() -> None:
    api = Client(REMOTE_ADDR="192.0.2.10", HTTP_ACCEPT="application/json")
    assert api.get("/k/ip/").status_code == 200
    refused = api.get("/k/ip/")
    assert refused.status_code == 429
    assert refused["Content-Type"] == "application/json"
    assert refused["Retry-After"] == "60"
    assert refused.json() == {"detail": "Too many requests; retry later.", "retry_after": 60}
    assert api.get("/k/header/").json() == {
        "detail": "Bad request: this request needs the header 'X-Api-Key'."
    }
    browser = Client(REMOTE_ADDR="192.0.2.10", HTTP_ACCEPT="text/html,*/*;q=0.8")
    assert browser.get("/k/ip/")["Content-Type"].startswith("text/plain")


def test_rlock_rate_limited_view_answers_over_the_limit(settings: SettingsWrapper) -> None:
    settings.RLOCK_RATE_LIMITED_VIEW = "tests.django.ratelimit_views.slow_down"
    client = Client(REMOTE_ADDR="192.0.2.11")
    assert client.get("/k/ip/").status_code == 200
    refused = client.get("/k/ip/")
    assert refused.status_code == 429
    assert refused.content == b"slow down (RateLimitExceeded)"
    assert refused["Retry-After"] == "60"  # added, as the view set none
    settings.RLOCK_RATE_LIMITED_VIEW = "tests.django.ratelimit_views.no_such_view"
    with pytest.raises(LockSettingError, match=r"RLOCK_RATE_LIMITED_VIEW = .* not an importable"):
        client.get("/k/ip/")


@pytest.mark.parametrize(
    ("arguments", "rule"),
    [
        ({"key": "ipp"}, "key must be one of 'ip', 'user', 'user_or_ip'"),
        ({"key": "post:"}, "must name the post field"),
        ({"key": "cookie:x"}, "key must be one of"),
        ({"key": 5}, "key must be one of"),
        ({"method": 5}, "method must be a str"),
        ({"method": []}, "at least one HTTP method"),
        ({"method": ["GET", "p o"]}, "method must name HTTP methods"),
        ({"block": "no"}, "block must be True or False"),
    ],
)
def test_bad_key_method_and_block_are_refused_when_decorating(
    arguments: dict[str, Any], rule: str
) -> None:
    with pytest.raises(ValueError, match=rule):
        rate_limited("job", "5/s", **arguments)


def test_key_method_and_block_false_need_a_view() -> None:
    @rate_limited("job", "5/s", key="ip")
    def job(n: int) -> int:
        return n

    with pytest.raises(TypeError, match="needs a view"):
        job(1)
