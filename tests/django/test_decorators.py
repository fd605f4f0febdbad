"""@locked on functions, function views, class-based views and async views."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.test import AsyncClient, Client
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock import locked, locks, rlock
from django_rlock.core import LockTimeout
from django_rlock.exceptions import LockSettingError
from django_rlock.signals import lock_acquired
from tests.django import views
from tests.django.conftest import Holders

HANG = 10.0


@pytest.fixture(autouse=True)
def _reset_view_events() -> Iterator[None]:
    views.release_holder.clear()
    views.holder_inside.clear()
    yield
    views.release_holder.set()  # never leave a view thread waiting
    views.async_release_holder = None


def test_key_is_bound_from_the_signature_with_defaults(r: redis.Redis) -> None:
    names: list[str] = []

    @locked("charge:{order_id}:{currency}")
    def charge(order_id: int, currency: str = "EUR") -> str:
        names.extend(locks["default"].names())
        return "charged"

    assert charge(1) == "charged"
    assert charge(order_id=2, currency="USD") == "charged"
    assert names == ["charge:1:EUR", "charge:2:USD"]
    assert list(locks["default"].names()) == []


def test_key_may_use_attributes_and_a_callable() -> None:
    class Customer:
        pk = 7

    seen: list[str] = []

    @locked("report:{customer.pk}", using="mem")
    def report(customer: Customer) -> None:
        seen.extend(locks["mem"].names())

    @locked(lambda customer: f"custom:{customer.pk}", using="mem")
    def custom(customer: Customer) -> None:
        seen.extend(locks["mem"].names())

    report(Customer())
    custom(Customer())
    assert seen == ["report:7", "custom:7"]


def test_template_naming_a_missing_argument_fails_at_decoration() -> None:
    def refund(request: object, order_id: int) -> None: ...

    with pytest.raises(
        ValueError, match=r"uses \{order\}, but .*refund.* has no parameter 'order'"
    ):
        locked("order:{order}")(refund)
    with pytest.raises(ValueError, match="not by position"):
        locked("order:{0}")(refund)
    with pytest.raises(ValueError, match="timeout must be >= 0"):
        locked("x", timeout=-1)
    with pytest.raises(ValueError, match="using must be a lock alias"):
        locked("x", using=None)  # type: ignore[arg-type]


def test_a_plain_function_raises_lock_timeout_when_busy(hold_elsewhere: Holders) -> None:
    @locked("job:{job_id}", timeout=0.05)
    def job(job_id: int) -> str:
        return "ran"

    hold_elsewhere("job:1", lease=20)
    with pytest.raises(LockTimeout) as caught:
        job(1)
    assert caught.value.retry_after is not None and caught.value.retry_after <= 20
    assert job(2) == "ran"


def test_the_lock_is_released_when_the_function_raises() -> None:
    @locked("fails")
    def fails() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError):
        fails()
    assert not locks["default"].lock("fails").locked()


def test_view_busy_answers_409_with_retry_after(hold_elsewhere: Holders) -> None:
    hold_elsewhere("order:5", lease=20)
    response = Client().get("/quick/5/")
    assert response.status_code == 409
    assert 1 <= int(response["Retry-After"]) <= 20
    assert b"order" not in response.content  # the lock name is not shown to the client
    assert Client().get("/quick/6/").status_code == 200


def test_busy_response_setting_and_option(
    settings: SettingsWrapper, hold_elsewhere: Holders
) -> None:
    hold_elsewhere("order:5")
    assert Client().get("/quick-423/5/").status_code == 423
    assert Client().get("/quick-callable/5/").status_code == 418
    with pytest.raises(LockTimeout):
        Client().get("/quick-raise/5/")
    settings.RLOCK_BUSY_RESPONSE = 503
    assert Client().get("/quick/5/").status_code == 503
    settings.RLOCK_BUSY_RESPONSE = "raise"
    with pytest.raises(LockTimeout):
        Client().get("/quick/5/")
    settings.RLOCK_BUSY_RESPONSE = "tests.django.views._teapot"
    assert Client().get("/quick/5/").status_code == 418
    settings.RLOCK_BUSY_RESPONSE = "raise it"
    with pytest.raises(LockSettingError, match="RLOCK_BUSY_RESPONSE = 'raise it'"):
        Client().get("/quick/5/")
    settings.RLOCK_BUSY_RESPONSE = 200.5
    with pytest.raises(LockSettingError, match="must be an HTTP status"):
        Client().get("/quick/5/")


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("rasie", "the busy_response argument must be an HTTP status"),
        (99, "must be an HTTP status"),
        (True, "must be an HTTP status"),
        ("not a path", "must be an HTTP status"),
    ],
)
def test_busy_response_is_checked_when_decorating(option: object, message: str) -> None:
    with pytest.raises(LockSettingError, match=message):
        locked("k", busy_response=option)


def test_a_dotted_busy_response_is_imported_on_first_use_not_when_decorating() -> None:
    """Its module may be the one being imported while the decorator runs."""

    @locked("k", busy_response="tests.django.not_yet_written.handler")
    def view(request: object) -> None: ...

    assert callable(view)


def test_rlock_non_blocking_with_a_timeout_is_refused_when_built() -> None:
    with pytest.raises(ValueError, match="non-blocking"):
        rlock("job:1", blocking=False, timeout=5)


def call_pay(start: threading.Barrier, statuses: list[int], retry_after: list[str]) -> None:
    """One client's request to the holding view, started with the others."""
    start.wait(HANG)
    response = Client().get("/pay/9/")
    statuses.append(response.status_code)
    if response.status_code == 409:
        retry_after.append(response["Retry-After"])


def test_eight_threads_contending_one_view_one_200_per_holder_turn() -> None:
    for _turn in range(2):
        views.release_holder.clear()
        views.holder_inside.clear()
        statuses: list[int] = []
        retry_after: list[str] = []
        start = threading.Barrier(8)
        threads = [
            threading.Thread(target=call_pay, args=(start, statuses, retry_after)) for _ in range(8)
        ]
        for thread in threads:
            thread.start()
        assert views.holder_inside.wait(HANG)
        # Every request but the holder's answers while the holder is inside.
        for _ in range(int(HANG * 100)):
            if len(statuses) == 7:
                break
            threading.Event().wait(0.01)
        assert statuses == [409] * 7
        views.release_holder.set()
        for thread in threads:
            thread.join(HANG)
        assert sorted(statuses) == [200] + [409] * 7
        assert all(1 <= int(value) <= 7 for value in retry_after)  # lease=7 on the view
        assert not locks["default"].lock("order:9").locked()


def test_method_decorator_on_class_based_views(hold_elsewhere: Holders) -> None:
    assert Client().get("/cbv/3/").content == b"cbv paid 3"
    hold_elsewhere("order:3")
    response = Client().get("/cbv/3/")
    assert response.status_code == 409 and "Retry-After" in response
    assert Client().get("/cbv/4/").status_code == 200


def test_method_decorator_on_dispatch_binds_the_request_and_url_kwargs() -> None:
    seen: list[str] = []

    def remember(**kwargs: Any) -> None:
        seen.append(kwargs["name"])

    lock_acquired.connect(remember)
    try:
        assert Client().get("/dispatch/8/").content == b"dispatched"
    finally:
        lock_acquired.disconnect(remember)
    assert seen == ["GET:8"]


def test_async_view_under_async_client() -> None:
    async def scenario() -> None:
        client = AsyncClient()
        response = await client.get("/async/1/")
        assert response.content == b"async paid 1"
        views.async_release_holder = asyncio.Event()
        first = asyncio.ensure_future(client.get("/async/2/"))
        for _ in range(int(HANG * 100)):
            if views.holder_inside.is_set():
                break
            await asyncio.sleep(0.01)
        assert views.holder_inside.is_set()
        busy = await asyncio.wait_for(client.get("/async/2/"), HANG)
        assert busy.status_code == 409 and int(busy["Retry-After"]) >= 1
        views.async_release_holder.set()
        assert (await asyncio.wait_for(first, HANG)).status_code == 200

    asyncio.run(scenario())
    assert not locks["default"].lock("order:2").locked()


def test_async_plain_function_raises_and_releases(hold_elsewhere: Holders) -> None:
    @locked("async-job:{n}", timeout=0)
    async def job(n: int) -> int:
        assert await asyncio.to_thread(locks["default"].lock(f"async-job:{n}").locked)
        return n

    assert asyncio.run(job(1)) == 1
    assert not locks["default"].lock("async-job:1").locked()
    hold_elsewhere("async-job:2")
    with pytest.raises(LockTimeout):
        asyncio.run(job(2))
