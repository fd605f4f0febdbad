"""Lock names: validation, and every key of one lock in one cluster hash slot."""

from __future__ import annotations

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from django_rlock.core import LockClient
from django_rlock.core.names import MAX_NAME_BYTES, LockKeys, check_name, escape, unescape


def slots(keys: LockKeys) -> set[int]:
    return {key_slot(key.encode()) for key in (keys.hash, keys.fence, keys.channel)}


@pytest.mark.parametrize("name", ["{", "}", "{}", "}{", "a{b}c", "{x}{y}", "%7B", "plain"])
def test_every_key_of_a_lock_shares_one_slot(name: str) -> None:
    keys = LockKeys.build("shop", name)
    assert len(slots(keys)) == 1
    assert LockKeys.name_of("shop", keys.hash) == name


def test_names_with_braces_lock_and_unlock_for_real(
    lock_client: LockClient, r: redis.Redis
) -> None:
    for name in ("{", "}", "{}", "a{b}c"):
        lock = lock_client.lock(name)
        with lock:
            stored = [key.decode() if isinstance(key, bytes) else key for key in r.keys("test:*")]
            # Besides the hash: the fencing counter and the owners' request latches.
            others = [key for key in stored if not key.endswith(":fence") and ":req:" not in key]
            assert others == [lock.keys.hash]
            assert lock.keys.fence in stored
            assert len(slots(lock.keys)) == 1
        assert not lock.locked()


@given(st.text(min_size=1, max_size=50))
def test_escaping_is_one_to_one_and_brace_free(name: str) -> None:
    escaped = escape(name)
    assert "{" not in escaped
    assert "}" not in escaped
    assert unescape(escaped) == name


@given(st.text(alphabet=st.characters(blacklist_categories=["Cc", "Cs"]), min_size=1))
def test_any_valid_name_keeps_its_keys_in_one_slot(name: str) -> None:
    if len(name.encode()) <= MAX_NAME_BYTES:
        assert len(slots(LockKeys.build("p", check_name(name)))) == 1


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("", "must not be empty"),
        (None, "must be a str"),
        (b"bytes", "must be a str"),
        ("a\x00b", "control characters"),
        ("line\nbreak", "control characters"),
        ("\x7f", "control characters"),
        ("x" * (MAX_NAME_BYTES + 1), "at most 1024 UTF-8 bytes"),
        ("é" * 513, "at most 1024 UTF-8 bytes"),
        ("\ud800", "UTF-8"),
    ],
)
def test_bad_names_are_refused_naming_the_rule(
    lock_client: LockClient, r: redis.Redis, name: object, rule: str
) -> None:
    with pytest.raises(ValueError, match=rule):
        lock_client.lock(name)  # type: ignore[arg-type]
    assert r.dbsize() == 0


def test_the_longest_name_is_accepted(lock_client: LockClient) -> None:
    lock = lock_client.lock("é" * 512)
    with lock:
        assert lock.owned()
