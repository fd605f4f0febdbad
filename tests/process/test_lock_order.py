"""The lock order check on real Redis: threads, asyncio tasks, every kind, and off by default.

``LockClient(lock_order_check=True)`` warns (:class:`LockOrderWarning`) the
first time an owner of the process takes two locks in the order opposite to
one seen before, naming both call sites, although no deadlock happened: the
owners here run one after the other. The graph itself is tested without a
server in tests/protocol/test_lockorder.py.
"""

# ruff: noqa: SIM117 -- nested on purpose: each lock's own line is the call site a warning names

from __future__ import annotations

import asyncio
import threading
import warnings
from collections.abc import Iterator

import pytest
import redis

from django_rlock.core import LockClient, LockOrderWarning
from django_rlock.core._process.lockorder import lock_order
from django_rlock.core.aio import AsyncLockClient

#: How long any one test thread may run before the test calls it hung.
HANG = 30.0


@pytest.fixture
def caught() -> Iterator[list[warnings.WarningMessage]]:
    """Every warning of the test; the process's graph starts empty and is emptied after."""
    lock_order.reset()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield seen
    lock_order.reset()


def inversions(seen: list[warnings.WarningMessage]) -> list[LockOrderWarning]:
    return [w.message for w in seen if isinstance(w.message, LockOrderWarning)]


@pytest.fixture
def client(r: redis.Redis, redis_url: str) -> Iterator[LockClient]:
    with LockClient(redis_url, key_prefix="test", lock_order_check=True) as made:
        yield made


def in_thread(target: object) -> None:
    thread = threading.Thread(target=target)  # type: ignore[arg-type]
    thread.start()
    thread.join(HANG)
    assert not thread.is_alive()


def test_threads_in_opposite_orders_warn_once_naming_both_call_sites(
    client: LockClient, caught: list[warnings.WarningMessage]
) -> None:
    def pay() -> None:
        with client.lock("order:1"):
            with client.lock("customer:7"):
                pass

    def refund() -> None:
        with client.lock("customer:7"):
            with client.lock("order:1"):
                pass

    in_thread(pay)
    in_thread(pay)
    assert inversions(caught) == []
    in_thread(refund)
    (warning,) = inversions(caught)
    now, earlier = warning.cycle
    assert (earlier.held, earlier.taken) == ("order:1", "customer:7")
    assert (now.held, now.taken) == ("customer:7", "order:1")
    assert earlier.held_at.function == earlier.taken_at.function == "pay"
    assert now.held_at.function == now.taken_at.function == "refund"
    assert {site.filename for site in (now.held_at, earlier.taken_at)} == {__file__}
    assert now.taken_at.lineno == now.held_at.lineno + 1
    assert f"{__file__}:{now.taken_at.lineno}" in str(warning)
    assert f"{__file__}:{earlier.taken_at.lineno}" in str(warning)
    in_thread(refund)
    assert len(inversions(caught)) == 1
    assert not client.lock("order:1").locked() and not client.lock("customer:7").locked()


def test_asyncio_tasks_in_opposite_orders_warn_naming_their_lines(
    r: redis.Redis, redis_url: str, caught: list[warnings.WarningMessage]
) -> None:
    async def main() -> None:
        client = AsyncLockClient(redis_url, key_prefix="test", lock_order_check=True)
        try:

            async def pay() -> None:
                async with client.lock("order:1"):
                    async with client.lock("customer:7"):
                        await asyncio.sleep(0)

            async def refund() -> None:
                async with client.lock("customer:7"):
                    async with client.lock("order:1"):
                        await asyncio.sleep(0)

            await asyncio.wait_for(asyncio.create_task(pay()), HANG)
            assert inversions(caught) == []
            await asyncio.wait_for(asyncio.create_task(refund()), HANG)
        finally:
            await client.aclose()

    asyncio.run(main())
    (warning,) = inversions(caught)
    now, earlier = warning.cycle
    assert (now.held, now.taken) == ("customer:7", "order:1")
    assert (now.taken_at.filename, now.taken_at.function) == (__file__, "refund")
    assert (earlier.taken_at.filename, earlier.taken_at.function) == (__file__, "pay")


def test_concurrent_tasks_in_one_global_order_warn_nothing(
    r: redis.Redis, redis_url: str, caught: list[warnings.WarningMessage]
) -> None:
    async def main() -> None:
        client = AsyncLockClient(redis_url, key_prefix="test", lock_order_check=True)
        try:

            async def work(n: int) -> None:
                for _ in range(5):
                    async with client.lock("a"):
                        async with client.lock(f"b:{n % 2}"):
                            async with client.lock("a"):  # re-entry
                                async with client.lock("c"):
                                    await asyncio.sleep(0)

            await asyncio.wait_for(asyncio.gather(*(work(n) for n in range(6))), HANG)
        finally:
            await client.aclose()

    asyncio.run(main())
    assert inversions(caught) == []
    assert lock_order.edges == 5  # a<b:0, a<b:1, a<c, b:0<c, b:1<c


def test_every_kind_takes_part(client: LockClient, caught: list[warnings.WarningMessage]) -> None:
    def forward() -> None:
        with client.fair_lock("fair"):
            with client.read_write_lock("rw").read:
                with client.semaphore("sem", 2):
                    pass

    def backward() -> None:
        with client.semaphore("sem", 2):
            with client.fair_lock("fair"):
                pass

    in_thread(forward)
    assert inversions(caught) == []
    in_thread(backward)
    (warning,) = inversions(caught)
    assert [(edge.held, edge.taken) for edge in warning.cycle] == [
        ("sem", "fair"),
        ("fair", "sem"),
    ]


def test_off_by_default(
    r: redis.Redis, redis_url: str, caught: list[warnings.WarningMessage]
) -> None:
    with LockClient(redis_url, key_prefix="test") as client:
        assert client.lock_order_check is False
        for first, second in (("a", "b"), ("b", "a")):
            with client.lock(first), client.lock(second):
                pass
        assert not client.holds._acquired  # nothing subscribed: nothing runs per grant
    assert inversions(caught) == []
    assert lock_order.edges == 0


def test_a_bad_option_is_refused(redis_url: str) -> None:
    with pytest.raises(ValueError, match="lock_order_check must be True or False"):
        LockClient(redis_url, lock_order_check="yes")  # type: ignore[arg-type]


def test_a_multilocks_members_have_no_order_but_what_it_waits_under_has(
    client: LockClient, caught: list[warnings.WarningMessage]
) -> None:
    # Two MultiLocks of the same locks in opposite orders cannot deadlock: it
    # gives back the members it took when one stays busy.
    def forward() -> None:
        with client.multi_lock(client.lock("a"), client.lock("b")):
            pass

    def backward() -> None:
        with client.multi_lock(client.lock("b"), client.lock("a")):
            pass

    in_thread(forward)
    in_thread(backward)
    assert inversions(caught) == []

    # Held before it, a lock comes before each member.
    def under_x() -> None:
        with client.lock("x"):
            with client.multi_lock(client.lock("a"), client.lock("b")):
                pass

    def b_then_x() -> None:
        with client.lock("b"):
            with client.lock("x"):
                pass

    in_thread(under_x)
    in_thread(b_then_x)
    (warning,) = inversions(caught)
    assert [(edge.held, edge.taken) for edge in warning.cycle] == [("b", "x"), ("x", "b")]


def test_threads_contending_in_one_global_order_warn_nothing(
    client: LockClient, caught: list[warnings.WarningMessage]
) -> None:
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            start.wait(HANG)
            for round_ in range(10):
                with client.lock("a", timeout=HANG):
                    with client.lock(f"b:{(n + round_) % 3}", timeout=HANG):
                        with client.lock("a"):  # re-entry
                            with client.lock("c", timeout=HANG):
                                pass
        except BaseException as error:  # noqa: BLE001 -- reported by the test below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HANG * 2)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    assert inversions(caught) == []
    assert lock_order.edges == 7  # a<b:k, b:k<c (k = 0, 1, 2), a<c
