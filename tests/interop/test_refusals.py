"""What ``layout="redisson"`` does not offer is refused when it is made, saying what to use."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import redis

from django_rlock.core import InvalidLockNameError, LockClient, RLock
from django_rlock.core.aio import AsyncLockClient


@pytest.fixture
def client(redis_url: str) -> LockClient:
    return LockClient(redis_url, layout="redisson", watchdog_timeout=3)


@pytest.mark.parametrize(
    ("make", "kind", "noun", "why"),
    [
        (lambda c: c.fair_lock("n"), "fair_lock", "fair lock", "Redisson's RFairLock queues"),
        (
            lambda c: c.read_write_lock("n"),
            "read_write_lock",
            "read-write lock",
            "Redisson's RReadWriteLock keeps a 'mode' field",
        ),
        (
            lambda c: c.semaphore("n", 3),
            "semaphore",
            "semaphore",
            "a permit taken without a lease never comes back when its holder dies",
        ),
    ],
)
def test_the_kinds_redisson_shares_otherwise_are_refused(
    client: LockClient, make: Callable[[LockClient], object], kind: str, noun: str, why: str
) -> None:
    with pytest.raises(ValueError, match="is not offered with layout='redisson'") as refused:
        make(client)
    message = str(refused.value)
    assert message.startswith(f"{kind}('n') is not offered with layout='redisson': ")
    assert why in message
    assert message.endswith(
        "Use lock('n') to share Redisson's RLock of that name, or a client with "
        f"layout='rlock' for a {noun} that only Python processes use"
    )
    client.close()


def test_the_asyncio_client_refuses_them_too(redis_url: str) -> None:
    async def main() -> None:
        async with AsyncLockClient(redis_url, layout="redisson") as client:
            for make in (
                lambda: client.fair_lock("n"),
                lambda: client.semaphore("n", 2),
                lambda: client.read_write_lock("n"),
            ):
                with pytest.raises(ValueError, match="is not offered with layout='redisson'"):
                    make()

    asyncio.run(main())


def test_a_lock_of_one_layout_is_not_made_on_a_client_of_the_other(
    client: LockClient, redis_url: str
) -> None:
    with pytest.raises(ValueError, match="speaking the 'rlock' layout cannot be made on a client"):
        RLock(client, "n")
    with LockClient(redis_url) as default:
        shared = type(client.lock("n"))
        with pytest.raises(ValueError, match="speaking the 'redisson' layout"):
            shared(default, "n")
    client.close()


def test_bad_settings_are_refused_with_what_is_offered(redis_url: str) -> None:
    with pytest.raises(ValueError, match="layout must be one of 'rlock', 'redisson', got 'java'"):
        LockClient(redis_url, layout="java")
    with pytest.raises(ValueError, match="sharded_subscription must be one of"):
        LockClient(redis_url, sharded_subscription="yes")
    with pytest.raises(ValueError, match="min_replicas=1 is not offered with layout='redisson'"):
        LockClient(redis_url, layout="redisson", min_replicas=1)
    with pytest.raises(NotImplementedError, match="sharded_subscription='on'"):
        AsyncLockClient(redis_url, layout="redisson", sharded_subscription="on")


@pytest.mark.parametrize("name", ["a{b", "x}", "{}", "}{"])
def test_names_redisson_cannot_use_on_a_cluster_are_refused(client: LockClient, name: str) -> None:
    with pytest.raises(InvalidLockNameError, match="cannot be shared with Redisson"):
        client.lock(name)
    client.close()


def test_the_default_layout_is_unchanged(redis_url: str, r: redis.Redis) -> None:
    with LockClient(redis_url, key_prefix="d") as client:
        assert client.layout == "rlock" and client.publish_command == "publish"
        with client.lock("order:42"):
            assert r.exists("d:{order:42}") and not r.exists("order:42")
