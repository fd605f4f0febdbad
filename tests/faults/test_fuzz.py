"""Fault 9: bad input. Names, timeouts and leases from hypothesis.

Every input either raises a ValueError that names the rule it broke, or works
exactly like any other lock; none reaches Redis as an error, and no key or
channel ever lands outside the client's prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_rlock.core import LockClient, LockLostError
from django_rlock.core._protocol.names import MAX_NAME_BYTES, LockKeys
from tests.servers import RedisServer

pytestmark = pytest.mark.faults

PREFIX = "fz"

#: Characters that stress the key layout: braces (the hash tag), the escape
#: character, separators, control characters, astral and combining characters.
_tricky = st.sampled_from(
    ["{", "}", "%", "%7B", ":", "*", " ", "\x00", "\n", "\x7f", "é", "😀", "\u0301"]
)
_names = st.one_of(
    st.text(min_size=0, max_size=40),
    st.lists(st.one_of(_tricky, st.text(max_size=3)), max_size=20).map("".join),
    # Around the byte limit: one-, two- and four-byte characters.
    st.tuples(st.sampled_from(["a", "é", "😀", "{"]), st.integers(250, 1030)).map(
        lambda spec: spec[0] * (spec[1] if spec[0] in "a{" else spec[1] // len(spec[0].encode()))
    ),
)
_seconds = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=1e-9, max_value=5.0),
    st.text(max_size=3),
)

FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def fuzz_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def fuzz_client(fuzz_server: RedisServer) -> Iterator[LockClient]:
    with LockClient(fuzz_server.url, key_prefix=PREFIX, watchdog_timeout=5) as client:
        yield client


@pytest.fixture(scope="module")
def admin(fuzz_server: RedisServer) -> Iterator[redis.Redis]:
    with fuzz_server.client() as client:
        yield client


def _all_inside_prefix(admin: redis.Redis, name: str) -> None:
    keys = [_text(key) for key in admin.keys("*")]
    assert keys and all(key.startswith(f"{PREFIX}:{{") for key in keys), keys
    hashes = [key for key in keys if LockKeys.name_of(PREFIX, key) is not None]
    assert [LockKeys.name_of(PREFIX, key) for key in hashes] == [name]


@FUZZ
@given(name=_names)
def test_any_name_is_refused_by_rule_or_locks_inside_the_prefix(
    name: str, fuzz_client: LockClient, admin: redis.Redis
) -> None:
    admin.flushdb()
    refused = _refusal(lambda: fuzz_client.lock(name))
    if refused is not None:
        assert refused.startswith("lock name must")
        size = len(name.encode("utf-8", "surrogatepass"))
        assert (
            not name
            or size > MAX_NAME_BYTES
            or "control characters" in refused
            or ("UTF-8" in refused)
        )
        return
    lock = fuzz_client.lock(name)
    assert lock.acquire(blocking=False)
    assert lock.acquire(blocking=False) and lock.hold_count() == 2
    _all_inside_prefix(admin, name)
    channels = [_text(channel) for channel in admin.pubsub_channels()]
    assert all(channel.startswith(f"{PREFIX}:{{") for channel in channels)
    lock.release()
    lock.release()
    assert not lock.locked()


@FUZZ
@given(blocking=st.booleans(), timeout=_seconds, lease=_seconds)
def test_any_timeout_and_lease_are_refused_by_rule_or_work(
    blocking: bool, timeout: object, lease: object, fuzz_client: LockClient, admin: redis.Redis
) -> None:
    admin.flushdb()
    lock = fuzz_client.lock("fuzz")
    granted: list[bool] = []
    refused = _refusal(lambda: granted.append(lock.acquire(blocking, timeout, lease)))  # type: ignore[arg-type]
    if refused is not None:
        assert refused.startswith(("timeout must", "lease must", "can't specify a timeout"))
        return
    assert granted == [True]  # the lock is free: any valid wait gets it at once
    assert isinstance(lease, int | float) or lease is None
    try:
        lock.release()
    except LockLostError:
        # Only a lease shorter than the round trips may have run out already.
        assert lease is not None and not isinstance(lease, bool) and lease < 0.05
    assert not lock.locked()


def _refusal(call: Callable[[], object]) -> str | None:
    """The message of the ValueError ``call`` raises, None when it raises none."""
    try:
        call()
    except ValueError as error:
        return str(error)
    return None


def _text(reply: bytes | str) -> str:
    return reply.decode("utf-8") if isinstance(reply, bytes) else reply
