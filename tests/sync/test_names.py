"""Lock names: validation, and every key of one lock in one cluster hash slot."""

from __future__ import annotations

import hashlib
import threading

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from django_rlock.core import InvalidLockNameError, LockClient, LockError
from django_rlock.core._protocol.names import (
    DIGEST_SEPARATOR,
    MAX_NAME_BYTES,
    DigestName,
    LockKeys,
    check_name,
    escape,
    fit_name,
    unescape,
)


def slots(keys: LockKeys) -> set[int]:
    return {key_slot(key.encode()) for key in (keys.hash, keys.fence, keys.channel)}


@pytest.mark.pure
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
            # A held lock is its hash alone (token and request latch are fields
            # of it); the names locked before left their latches.
            others = [key for key in stored if not key.endswith("}:req")]
            assert others == [lock.keys.hash]
            assert r.hget(lock.keys.hash, "~t") == str(lock.token).encode()
            assert len(slots(lock.keys)) == 1
        assert not lock.locked()


@pytest.mark.pure
@given(st.text(min_size=1, max_size=50))
def test_escaping_is_one_to_one_and_brace_free(name: str) -> None:
    escaped = escape(name)
    assert "{" not in escaped
    assert "}" not in escaped
    assert unescape(escaped) == name


@pytest.mark.pure
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
    with pytest.raises(InvalidLockNameError, match=rule) as refused:
        lock_client.lock(name)  # type: ignore[arg-type]
    # Bad input, not a lock error: callers (and views, as a 400) catch it apart.
    assert isinstance(refused.value, ValueError)
    assert not isinstance(refused.value, LockError)
    assert r.dbsize() == 0


def test_the_longest_name_is_accepted(lock_client: LockClient) -> None:
    lock = lock_client.lock("é" * 512)
    with lock:
        assert lock.owned()


@pytest.mark.pure
def test_short_names_are_kept_as_they_are() -> None:
    assert fit_name("order:42") == "order:42"
    assert type(fit_name("order:42")) is str
    longest = "é" * 512
    assert fit_name(longest) == longest
    assert LockKeys.build("shop", "order:42").hash == "shop:{order:42}"  # unchanged layout


@pytest.mark.pure
def test_a_long_name_becomes_its_head_and_digest() -> None:
    name = "page:" + "a" * 2000
    fitted = fit_name(name)
    assert isinstance(fitted, DigestName)
    head, separator, digest = fitted.partition(DIGEST_SEPARATOR)
    assert head == name[:200]
    assert separator == DIGEST_SEPARATOR and digest.startswith("sha256:")
    assert len(fitted.encode()) <= MAX_NAME_BYTES
    assert check_name(fitted) is fitted
    assert fit_name(name + "b") != fitted  # hashed, never truncated


@pytest.mark.pure
@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("a" * 2000 + "\n", "control characters"),  # past the head: still refused
        ("a" * 2000 + "\ud800", "UTF-8"),
        ("", "must not be empty"),
    ],
)
def test_a_long_name_follows_every_other_rule(name: str, rule: str) -> None:
    with pytest.raises(InvalidLockNameError, match=rule):
        fit_name(name)


def test_the_digest_form_cannot_be_passed_as_a_name(lock_client: LockClient) -> None:
    fitted = fit_name("page:" + "a" * 2000)
    with pytest.raises(InvalidLockNameError, match="digest form of a name longer than 1024"):
        lock_client.lock(str(fitted))
    with pytest.raises(InvalidLockNameError, match="control characters"):
        lock_client.lock(f"page:a{DIGEST_SEPARATOR}b")


def test_a_crafted_name_and_the_long_name_hold_different_keys(
    lock_client: LockClient, r: redis.Redis
) -> None:
    long_name = "page:" + "a" * 2000
    digest = hashlib.sha256(long_name.encode()).hexdigest()
    # The long name's form before this fix: a 268-character name anyone could pass.
    crafted = f"{long_name[:200]}...#{digest}"
    assert len(crafted) == 268
    long_lock = lock_client.lock(fit_name(long_name))
    crafted_lock = lock_client.lock(fit_name(crafted))
    assert long_lock.keys.hash != crafted_lock.keys.hash
    assert crafted_lock.keys.hash == f"test:{{{crafted}}}"  # a short name keeps its key
    assert long_lock.acquire(blocking=False)
    taken: list[bool] = []
    other_owner = threading.Thread(
        target=lambda: taken.append(crafted_lock.acquire(blocking=False))
    )
    other_owner.start()
    other_owner.join(10)
    assert taken == [True]  # both held at once, by different owners
    assert long_lock.owned() and not crafted_lock.owned()
    long_lock.release()
    assert crafted_lock.force_release()  # its owner thread has ended


def test_a_long_names_key_lists_as_its_digest_form(lock_client: LockClient) -> None:
    fitted = fit_name("page:" + "{}" * 600)
    lock = lock_client.lock(fitted)
    listed = LockKeys.name_of("test", lock.keys.hash)
    assert listed == fitted and isinstance(listed, DigestName)
    with lock:
        assert lock_client.lock(listed).locked()  # the listed name reaches the same lock
        assert len(slots(lock.keys)) == 1
