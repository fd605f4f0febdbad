"""The Django face of semaphores: ``semaphore()``, ``@locked(..., permits=N)``, busy views."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory

from django_rlock import locked, locks, semaphore
from django_rlock.backends._semaphores import AliasSemaphore, AsyncAliasSemaphore
from django_rlock.core import LockTimeout
from django_rlock.signals import lock_acquired
from tests.django.conftest import HoldingThreads


class PermitHolders(HoldingThreads):
    """Permits held by live threads of their own until the test ends."""

    def __call__(self, name: str, permits: int, *, using: str = "default") -> None:
        """Hold a permit of semaphore ``name`` (of ``permits``) on another thread."""
        self.keep(lambda: semaphore(name, permits, using=using), f"a permit of {name!r}")


@pytest.fixture
def hold_permit() -> Iterator[PermitHolders]:
    holders = PermitHolders()
    yield holders
    holders.close()


@pytest.mark.parametrize("using", ["default", "mem"])
def test_the_shortcut_holds_one_permit_and_reports_it(using: str) -> None:
    acquired: list[Any] = []

    def on_acquired(sender: object, **kwargs: Any) -> None:
        acquired.append(kwargs["lock"])

    lock_acquired.connect(on_acquired)
    try:
        pool = semaphore("pool", 2, using=using)
        assert isinstance(pool, AliasSemaphore)
        with pool:
            assert pool.hold_count() == 1 and pool.available() == 1
            with semaphore("pool", 2, using=using, timeout=0):
                assert pool.available() == 0
                with pytest.raises(LockTimeout), semaphore("pool", 2, using=using, timeout=0):
                    pass
        assert pool.available() == 2
    finally:
        lock_acquired.disconnect(on_acquired)
    # A thread's second permit is one more hold of the same owner, as a
    # re-entry is: the signal tells of the owner's first.
    assert [lock.name for lock in acquired] == ["pool"]


def test_async_with_takes_a_task_owned_permit() -> None:
    async def scenario() -> tuple[int, bool]:
        most = inside = 0
        twins: list[object] = []

        async def work() -> None:
            nonlocal most, inside
            async with semaphore("async-pool", 2) as twin:
                twins.append(twin)
                inside += 1
                most = max(most, inside)
                await asyncio.sleep(0.05)
                inside -= 1

        await asyncio.gather(*(work() for _ in range(5)))
        return most, all(isinstance(twin, AsyncAliasSemaphore) for twin in twins)

    most, native = asyncio.run(scenario())
    assert most == 2
    assert native
    assert locks["default"].semaphore("async-pool", 2).available() == 2


def test_permits_are_checked_when_decorating() -> None:
    with pytest.raises(ValueError, match="permits must be an int >= 1"):
        locked("x", permits=0)


def test_a_view_holds_one_permit_and_answers_409_when_none_is_free(
    rf: RequestFactory, hold_permit: PermitHolders
) -> None:
    seen: list[int] = []

    @locked("partner:{tenant}", permits=2, timeout=0)
    def call_partner(request: HttpRequest, tenant: str) -> HttpResponse:
        seen.append(locks["default"].semaphore(f"partner:{tenant}", 2).available())
        return HttpResponse("ok")

    hold_permit("partner:acme", 2)
    response = call_partner(rf.get("/"), "acme")
    assert response.status_code == 200
    assert seen == [0]  # the held permit and the view's own
    hold_permit("partner:acme", 2)
    busy = call_partner(rf.get("/"), "acme")
    assert busy.status_code == 409
    assert int(busy["Retry-After"]) >= 1
    assert call_partner(rf.get("/"), "other").status_code == 200  # per tenant


def test_an_async_view_holds_one_permit(rf: RequestFactory, hold_permit: PermitHolders) -> None:
    @locked("async-partner:{tenant}", permits=1, timeout=0)
    async def call_partner(request: HttpRequest, tenant: str) -> HttpResponse:
        free = await locks["default"].async_semaphore(f"async-partner:{tenant}", 1).available()  # type: ignore[attr-defined]
        return HttpResponse(str(free))

    response = asyncio.run(call_partner(rf.get("/"), "acme"))
    assert response.status_code == 200 and response.content == b"0"
    hold_permit("async-partner:acme", 1)
    assert asyncio.run(call_partner(rf.get("/"), "acme")).status_code == 409


def test_a_plain_function_raises_lock_timeout(hold_permit: PermitHolders) -> None:
    @locked("job", permits=1, timeout=0)
    def job() -> str:
        return "ran"

    assert job() == "ran"
    hold_permit("job", 1)
    with pytest.raises(LockTimeout, match="semaphore 'job'"):
        job()
