"""asyncio in the Django face: ``async with rlock()``, native async ``@locked`` views."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import redis
from django.test import AsyncClient

from django_rlock import rlock, signals
from django_rlock.core.aio import AsyncRLock
from django_rlock.core.exceptions import LockTimeout
from tests.django import views
from tests.django.conftest import HANG
from tests.lockhash import owner_counts


def test_async_with_rlock_is_owned_by_the_task(r: redis.Redis) -> None:
    received: list[tuple[str, dict[str, Any]]] = []

    def on_acquired(**kwargs: Any) -> None:
        received.append(("acquired", kwargs))

    def on_released(**kwargs: Any) -> None:
        received.append(("released", kwargs))

    signals.lock_acquired.connect(on_acquired)
    signals.lock_released.connect(on_released)

    async def scenario() -> None:
        async with rlock("order:7") as lock:
            assert isinstance(lock, AsyncRLock)
            assert await lock.owned()
            owners = list(owner_counts(r, "t:{order:7}"))
            assert len(owners) == 1
            assert ":task-" in owners[0]

            async def other_task() -> None:
                async with rlock("order:7", timeout=0.05):
                    pass

            with pytest.raises(LockTimeout) as caught:
                await asyncio.create_task(other_task())
            assert caught.value.retry_after is not None
        assert not r.exists("t:{order:7}")

    try:
        asyncio.run(scenario())
    finally:
        signals.lock_acquired.disconnect(on_acquired)
        signals.lock_released.disconnect(on_released)
    assert [kind for kind, _ in received] == ["acquired", "released"]
    assert received[0][1]["alias"] == "default"
    assert received[1][1]["held"] >= 0


def test_async_with_rlock_on_a_thread_owned_backend() -> None:
    async def scenario() -> None:
        async with rlock("job", using="mem"):
            taken = await asyncio.to_thread(lambda: rlock("job", using="mem").acquire(False))
            assert taken is False
        assert await asyncio.to_thread(lambda: not rlock("job", using="mem").locked())

    asyncio.run(scenario())


def test_async_view_under_contention_answers_409_natively(r: redis.Redis) -> None:
    views.holder_inside.clear()

    async def scenario() -> list[Any]:
        client = AsyncClient()
        views.async_release_holder = asyncio.Event()
        first = asyncio.ensure_future(client.get("/async/3/"))
        while not views.holder_inside.is_set():
            await asyncio.sleep(0.01)
        # Native: the holder is the request's task, and no thread was started for it.
        owners = list(owner_counts(r, "t:{order:3}"))
        assert len(owners) == 1
        assert ":task-" in owners[0]
        assert not any(t.name.startswith("rlock-async") for t in threading.enumerate())
        busy = await asyncio.wait_for(
            asyncio.gather(*(client.get("/async/3/") for _ in range(7))), HANG
        )
        views.async_release_holder.set()
        return [await asyncio.wait_for(first, HANG), *busy]

    try:
        first, *busy = asyncio.run(scenario())
    finally:
        views.async_release_holder = None
    assert first.status_code == 200
    assert [response.status_code for response in busy] == [409] * 7
    assert all(int(response["Retry-After"]) >= 1 for response in busy)
    assert not r.exists("t:{order:3}")
