"""``layout="redisson"`` without a server: Redisson's names and keys, the refusals, the wake-up."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from django_rlock.core._protocol.channels import ChannelTable
from django_rlock.core._protocol.layouts import check_layout, check_sharded_subscription, refusal
from django_rlock.core._protocol.names import MAX_NAME_BYTES, check_name
from django_rlock.core._protocol.redisson import (
    ACQUIRE,
    FORCE_RELEASE,
    RELEASE,
    check_redisson_name,
    prefix_name,
    redisson_keys,
)
from django_rlock.core.exceptions import InvalidLockNameError

pytestmark = pytest.mark.pure


def redis_slot(key: str) -> int:
    return key_slot(key.encode("utf-8"))


def test_the_name_is_the_key_and_redissons_keys_are_redissons() -> None:
    keys = redisson_keys("shop", "order:42")
    assert keys.hash == "order:42"
    assert keys.channel == "redisson_lock__channel:{order:42}"
    assert keys.token == "redisson_lock_token:{order:42}"
    # This library's own keys: under the prefix, in the name's slot.
    assert keys.holder == keys.fence == "shop:redisson:{order:42}:holder"
    assert keys.latch("u:1") == "shop:redisson:{order:42}:req:u:1"
    assert redisson_keys("", "a").holder == "redisson:{a}:holder"


def test_a_name_with_its_own_hash_tag_keeps_it_and_never_meets_another_name() -> None:
    tagged = redisson_keys("shop", "{order}:42")
    assert tagged.channel == "redisson_lock__channel:{order}:42"  # Redisson's prefixName
    assert tagged.holder == "shop:redisson:tag:{order}:42:holder"
    # prefixName gives "a" and "{a}" one channel (Redisson's own); our keys stay apart.
    assert prefix_name("p", "a") == prefix_name("p", "{a}")
    assert redisson_keys("shop", "a").holder != redisson_keys("shop", "{a}").holder


@pytest.mark.parametrize("name", ["{", "}", "{}", "}{", "a}b{c}", "{}x}", "a{b", "x}"])
def test_names_redisson_cannot_use_on_a_cluster_are_refused(name: str) -> None:
    with pytest.raises(InvalidLockNameError, match="cannot be shared with Redisson"):
        check_redisson_name(name)


@pytest.mark.parametrize("name", ["order:42", "{order}:42", "a{b}c", "{x}{y}", "{a}}", "%7B"])
def test_other_names_are_kept_as_they_are(name: str) -> None:
    assert check_redisson_name(name) == name


@settings(max_examples=200, deadline=None)
@given(
    name=st.text(alphabet=st.sampled_from("ab:{}%x"), min_size=1, max_size=12),
    prefix=st.sampled_from(["", "shop", "a:b"]),
)
def test_every_key_of_a_usable_name_is_in_its_slot(name: str, prefix: str) -> None:
    """Redis Cluster runs a script only when its keys share a slot: the name's."""
    try:
        check_redisson_name(check_name(name))
    except InvalidLockNameError:
        return
    keys = redisson_keys(prefix, name)
    every = [keys.hash, keys.channel, keys.token, keys.holder, keys.waiters, keys.latch("o:1")]
    assert {redis_slot(key) for key in every} == {redis_slot(name)}


@settings(max_examples=100, deadline=None)
@given(name=st.text(alphabet=st.characters(blacklist_categories=["Cc", "Cs"]), min_size=1))
def test_any_name_is_either_refused_or_slot_safe(name: str) -> None:
    if len(name.encode()) > MAX_NAME_BYTES:
        return
    try:
        check_redisson_name(check_name(name))
    except InvalidLockNameError:
        return
    keys = redisson_keys("p", name)
    assert redis_slot(keys.channel) == redis_slot(keys.token) == redis_slot(name)


def test_the_hash_holds_owner_fields_only_and_releases_say_zero() -> None:
    # The token and the description go to KEYS[3], never into the lock's hash (KEYS[1]).
    assert (
        "hset', KEYS[3], '~t', fence, '~since', string.format('%.0f', since), '~holder'" in ACQUIRE
    )
    assert "hset', KEYS[1], '~" not in ACQUIRE
    # Redisson decodes messages as Java longs: its UNLOCK_MESSAGE, 0.
    assert "KEYS[2], '0')" in RELEASE and "KEYS[2], '0')" in FORCE_RELEASE
    # Redisson's counter expires with the grant, and is set again when this side lets go.
    assert "redis.call('set', KEYS[2], fence, 'px', ttl)\n" in ACQUIRE
    assert "redis.call('pexpire', KEYS[4], life)" in RELEASE
    assert "redis.call('set', KEYS[4], fence, 'px', life)\n" in RELEASE


class _Waiter:
    def __init__(self, waiter_id: str) -> None:
        self.waiter_id = waiter_id
        self.woken = 0

    def wake(self, grant: bytes = b"") -> None:
        self.woken += 1

    def recheck(self) -> None:
        pass


def test_redissons_message_wakes_every_waiter_of_the_channel() -> None:
    table: ChannelTable[_Waiter] = ChannelTable()
    first, second = _Waiter("ab12:1"), _Waiter("ab12:2")
    table.add(b"redisson_lock__channel:{x}", first)
    table.add(b"redisson_lock__channel:{x}", second)
    table.deliver([b"message", b"redisson_lock__channel:{x}", b"0"])
    assert (first.woken, second.woken) == (1, 1)
    table.deliver([b"smessage", b"redisson_lock__channel:{x}", b"1"])
    assert (first.woken, second.woken) == (2, 2)
    table.deliver([b"message", b"redisson_lock__channel:{x}", b"ab12:2"])  # a waiter's id
    assert (first.woken, second.woken) == (2, 3)


def test_layouts_and_subscription_modes_are_checked() -> None:
    assert check_layout("redisson") == "redisson"
    with pytest.raises(ValueError, match="layout must be one of 'rlock', 'redisson'"):
        check_layout("java")
    assert check_sharded_subscription("off") == "off"
    with pytest.raises(ValueError, match="ShardedSubscriptionMode AUTO, ON, OFF"):
        check_sharded_subscription("ON")


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("fair_lock", "RFairLock"),
        ("read_write_lock", "RReadWriteLock"),
        ("semaphore", "never comes back when its holder dies"),
    ],
)
def test_a_refused_kind_says_why_and_what_to_use(kind: str, why: str) -> None:
    message = str(refusal(kind, "rlock", "redisson", "n"))
    assert f"{kind}('n') is not offered with layout='redisson'" in message
    assert why in message
    assert "Use lock('n') to share Redisson's RLock" in message
    assert "layout='rlock'" in message
