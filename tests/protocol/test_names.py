"""Names to keys and back, and the checks every argument goes through.

(tests/sync/test_names.py has the one-slot and escaping properties of a
lock's own keys, and the refusals as a client raises them.)
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from django_rlock.core._protocol.fairlock import fair_keys
from django_rlock.core._protocol.names import (
    MAX_NAME_BYTES,
    MAX_SECONDS,
    DigestName,
    LockKeys,
    check_key_prefix,
    check_lease,
    check_max_hold,
    check_name,
    check_timeout,
    check_watchdog_timeout,
    fit_name,
    milliseconds,
)
from django_rlock.core._protocol.rwlock import RWKeys
from django_rlock.core._protocol.semaphore import check_permits, semaphore_keys
from django_rlock.core.exceptions import InvalidLockNameError

pytestmark = pytest.mark.pure

NAMES = st.text(alphabet=st.characters(blacklist_categories=["Cc", "Cs"]), min_size=1, max_size=60)


@settings(max_examples=200)
@given(first=NAMES, second=NAMES, prefix=st.sampled_from(["", "p", "p:q"]))
def test_two_names_never_share_a_key(first: str, second: str, prefix: str) -> None:
    if first == second:
        return
    one, other = LockKeys.build(prefix, first), LockKeys.build(prefix, second)
    keys_of_one = {one.hash, one.fence, one.waiters, one.channel}
    keys_of_other = {other.hash, other.fence, other.waiters, other.channel}
    assert not keys_of_one & keys_of_other


@settings(max_examples=200)
@given(name=NAMES, prefix=st.sampled_from(["", "p", "a:b", "%7B", "50%"]))
def test_a_lock_hash_lists_back_as_its_name(name: str, prefix: str) -> None:
    assert LockKeys.name_of(prefix, LockKeys.build(prefix, name).hash) == name


@pytest.mark.parametrize(
    "key",
    [
        "p:{order}:fence",  # a lock's other keys are not locks
        "p:{order}:waiters",
        "p:{order}:req:owner-1",
        "p:{order}:req",  # the name's latches after a release
        "q:{order}",  # another prefix
        "p:order",  # no hash tag
        "p:{a}{b}",  # never made by escaping
        "{order}",  # no prefix where one is expected
    ],
)
def test_a_key_that_is_not_a_lock_hash_lists_as_no_name(key: str) -> None:
    assert LockKeys.name_of("p", key) is None


def test_the_other_kinds_hashes_list_as_no_lock() -> None:
    for key in (
        fair_keys("p", "n").hash,
        semaphore_keys("p", "n").hash,
        RWKeys.build("p", "n").write,
    ):
        assert LockKeys.name_of("p", key) is None, key


def test_a_long_names_digest_form_lists_back_as_a_digest_name() -> None:
    fitted = fit_name("report:" + "x" * 3000)
    listed = LockKeys.name_of("p", LockKeys.build("p", fitted).hash)
    assert listed == fitted and isinstance(listed, DigestName)


@pytest.mark.parametrize("prefix", ["a{b", "a}b", "x\ny", 3, None])
def test_a_key_prefix_may_not_hold_braces_or_control_characters(prefix: object) -> None:
    with pytest.raises(ValueError, match="key_prefix"):
        check_key_prefix(prefix)


@pytest.mark.parametrize(
    ("check", "value", "expected"),
    [
        (check_timeout, None, None),
        (check_timeout, 0, 0.0),
        (check_timeout, 2, 2.0),
        (check_lease, None, None),
        (check_lease, 0.001, 0.001),
        (check_lease, MAX_SECONDS, MAX_SECONDS),
        (check_max_hold, None, None),
        (check_max_hold, 30, 30.0),
        (check_watchdog_timeout, 0.5, 0.5),
        (check_watchdog_timeout, 30, 30.0),
    ],
)
def test_usable_seconds_pass_as_floats(check: object, value: object, expected: object) -> None:
    checked = check(value)  # type: ignore[operator]
    assert checked == expected and (expected is None or isinstance(checked, float))


@pytest.mark.parametrize(
    ("check", "value", "rule"),
    [
        (check_timeout, -0.001, ">= 0"),
        (check_timeout, math.nan, "finite"),
        (check_timeout, True, "number of seconds, not bool"),
        (check_timeout, "3", "number of seconds, not str"),
        (check_lease, 0, "> 0"),
        (check_lease, MAX_SECONDS * 2, "at most"),  # Lua would send it as 2e+09
        (check_lease, math.inf, "finite"),
        (check_max_hold, 0, "> 0"),
        (check_watchdog_timeout, None, "not NoneType"),
        (check_watchdog_timeout, 0.49, "at least 0.5"),
        (check_watchdog_timeout, 0, "> 0"),
        (check_watchdog_timeout, MAX_SECONDS + 1, "at most"),
        (check_permits, 0, ">= 1"),
        (check_permits, True, "not bool"),
        (check_permits, 2.0, "not float"),
    ],
)
def test_unusable_arguments_are_refused_naming_the_rule(
    check: object, value: object, rule: str
) -> None:
    with pytest.raises(ValueError, match=rule.replace("+", r"\+")):
        check(value)  # type: ignore[operator]


def test_a_watchdog_timeout_too_short_says_what_a_renewal_would_get() -> None:
    with pytest.raises(ValueError, match=r"renewals run every timeout/3.*\(50 ms here\)"):
        check_watchdog_timeout(0.3)


@pytest.mark.parametrize(
    ("seconds", "ms"), [(1, 1000), (0.0001, 1), (0, 1), (1.0001, 1001), (2.5, 2500)]
)
def test_milliseconds_are_whole_rounded_up_and_never_zero(seconds: float, ms: int) -> None:
    # Redis takes whole milliseconds; zero would mean "expire now" or be refused.
    assert milliseconds(seconds) == ms


# -- what is remembered per name (the Django face makes a lock object per block) --------


def test_a_digest_name_checked_first_never_lets_its_text_through_as_a_plain_name() -> None:
    # check_name and fit_name remember the plain names they passed; the digest
    # form of a long name passes only as a DigestName, whatever was asked before.
    digest = fit_name("x" * (MAX_NAME_BYTES + 1))
    assert isinstance(digest, DigestName)
    for _ in range(2):
        assert check_name(digest) == digest
        assert fit_name(digest) == digest
        with pytest.raises(InvalidLockNameError):
            check_name(str(digest))
        with pytest.raises(InvalidLockNameError):
            fit_name(str(digest))


def test_a_remembered_name_is_still_refused_when_too_long_or_not_a_str() -> None:
    check_name("order:1")
    assert check_name("order:1") == "order:1"
    with pytest.raises(InvalidLockNameError):
        check_name("y" * (MAX_NAME_BYTES + 1))
    with pytest.raises(InvalidLockNameError):
        check_name(b"order:1")


def test_keys_built_once_per_name_are_the_keys_of_that_name_and_kind() -> None:
    plain = LockKeys.build("shop", "order:1")
    assert LockKeys.build("shop", "order:1") == plain
    assert LockKeys.build("other", "order:1").hash == "other:{order:1}"
    assert fair_keys("shop", "order:1").hash == "shop:{order:1}:fair"
    # A DigestName keeps its own type in its keys (it is never remembered).
    digest = fit_name("z" * (MAX_NAME_BYTES + 1))
    assert isinstance(LockKeys.build("shop", digest).name, DigestName)
