"""RESP packing (``_protocol/resp.py``): byte for byte what redis-py packs, for any parts."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.connection import Connection

from django_rlock.core._protocol import resp
from django_rlock.core._protocol.calls import (
    NOT_WAITING,
    acquire_call,
    acquire_template,
    no_lost_tail,
    release_call,
    release_template,
)
from django_rlock.core._protocol.names import LockKeys

pytestmark = pytest.mark.pure

parts = st.one_of(
    st.text(),
    st.binary(),
    st.integers(min_value=-(2**63), max_value=2**63),
    st.floats(allow_nan=False, allow_infinity=False),
)


def redis_py(*args: object) -> bytes:
    return b"".join(Connection().pack_command(*args))  # type: ignore[no-untyped-call]


@given(st.lists(parts, min_size=1, max_size=20))
def test_a_command_is_packed_as_redis_py_packs_it(values: list[resp.Part]) -> None:
    # A fixed command name: redis-py splits a first part with spaces into several.
    assert resp.command("SET", *values) == redis_py("SET", *values)


@given(
    st.text(min_size=1, max_size=40),
    st.lists(st.text(), max_size=5),
    st.lists(parts, max_size=10),
)
def test_evalsha_is_packed_as_redis_py_packs_it(
    sha: str, keys: list[str], args: list[resp.Part]
) -> None:
    fresh = args[0] if args else ""
    packed = resp.evalsha(sha, keys, args, fresh)
    assert packed == redis_py("EVALSHA", sha, len(keys), *keys, *args)
    assert resp.evalsha(sha, keys, args, fresh) == packed  # remembered parts: the same bytes


def test_the_lock_calls_are_packed_as_redis_py_packs_them() -> None:
    keys = LockKeys.build("shop", "order:{42}")
    owner = "0123456789abcdef0123456789abcdef:7"
    for call in (
        acquire_call(keys, owner, ttl=30.0, waiter_id="w:1", sleep=0.25, rid="9", holder="{}"),
        release_call(keys, owner, "publish", "10"),
    ):
        expected = redis_py("EVALSHA", "f" * 40, len(call.keys), *call.keys, *call.args)
        assert resp.evalsha("f" * 40, call.keys, call.args, call.rid) == expected


def test_equal_values_of_other_types_are_not_mixed_up() -> None:
    # 1, 1.0 and "1" are equal or alike as dict keys; each keeps its own encoding.
    assert resp.evalsha("s", [], [1, 1.0, "1"]) == redis_py("EVALSHA", "s", 0, 1, 1.0, "1")
    assert resp.evalsha("s", [], [1.0, 1]) == redis_py("EVALSHA", "s", 0, 1.0, 1)


def test_a_bool_or_none_is_refused() -> None:
    with pytest.raises(TypeError):
        resp.evalsha("s", [], [True])
    with pytest.raises(TypeError):
        resp.bulk(None)  # type: ignore[arg-type]


def test_the_memo_is_bounded() -> None:
    for index in range(resp.MEMO_LIMIT + 10):
        resp.evalsha("s", [f"key:{index}"], [])
    assert len(resp._memo) <= resp.MEMO_LIMIT


@given(st.text(min_size=1), st.text(), st.text(), st.integers(0, 10**6), st.integers(0, 9))
def test_the_lock_templates_pack_what_the_calls_say(
    name: str, owner: str, waiter: str, sleep_ms: int, holds: int
) -> None:
    keys = LockKeys.build("shop", name)
    sha = "c" * 40
    for rid, token in (("1", 0), ("123456", 99)):
        call = acquire_call(
            keys,
            owner,
            ttl=12.5,
            waiter_id=waiter,
            sleep=sleep_ms / 1000,
            rid=rid,
            lost=(token, holds) if holds else None,
            holder='{"host":"h"}',
        )
        packed = acquire_template(keys, owner, 12.5).pack(sha, *call.args[2:])
        assert packed == resp.evalsha(sha, call.keys, call.args)
        free = release_call(keys, owner, "spublish", rid)
        assert release_template(keys, owner, "spublish").pack(sha, rid) == resp.evalsha(
            sha, free.keys, free.args
        )


@given(st.text(min_size=1), st.text(), st.text(), st.integers(1, 10**12))
def test_an_uncontended_call_packed_fresh_is_the_call_packed_whole(
    name: str, owner: str, holder: str, rid_number: int
) -> None:
    # The hot path packs what changes (the request id) between parts encoded
    # once (Template.pack_fresh): the bytes must be the call's, every byte.
    keys = LockKeys.build("shop", name)
    sha = "c" * 40
    rid = str(rid_number)
    call = acquire_call(
        keys, owner, ttl=30.0, waiter_id="", sleep=0.0, rid=rid, lost=None, holder=holder
    )
    fresh = acquire_template(keys, owner, 30.0).pack_fresh(
        sha, NOT_WAITING, rid, no_lost_tail(holder)
    )
    assert (
        fresh
        == resp.evalsha(sha, call.keys, call.args)
        == redis_py("EVALSHA", sha, 3, *call.keys, *call.args)
    )
    free = release_call(keys, owner, "publish", rid)
    packed = release_template(keys, owner, "publish").pack_fresh(sha, b"", rid, b"")
    assert packed == resp.evalsha(sha, free.keys, free.args)
