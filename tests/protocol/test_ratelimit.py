"""The rate limiter's protocol without a server: rates, bursts, permits, keys, replies."""

from __future__ import annotations

import pytest

from django_rlock.core._protocol.names import LockKeys
from django_rlock.core._protocol.ratelimit import (
    LimiterState,
    Rate,
    RateLimiterBase,
    check_burst,
    check_take,
    limiter_key,
    limiter_name,
    limiter_state,
    parse_rate,
    reservation,
)

pytestmark = pytest.mark.pure


@pytest.mark.parametrize(
    ("text", "count", "period", "interval_us"),
    [
        ("50/s", 50, 1, 20_000.0),
        ("100/m", 100, 60, 600_000.0),
        ("3/h", 3, 3600, 1_200_000_000.0),
        ("1/d", 1, 86400, 86_400_000_000.0),
        ("1000000/s", 1_000_000, 1, 1.0),
    ],
)
def test_a_rate_is_a_count_per_period(
    text: str, count: int, period: int, interval_us: float
) -> None:
    rate = parse_rate(text)
    assert rate == Rate(count, period)
    assert rate.interval_us == interval_us
    assert str(rate) == text
    assert parse_rate(rate) is rate


@pytest.mark.parametrize(
    ("rate", "rule"),
    [
        ("0/s", "at least 1 permit"),
        ("-1/m", "'N/s', 'N/m'"),
        ("abc", "'N/s', 'N/m'"),
        ("10/w", "'N/s', 'N/m'"),
        ("1.5/s", "whole number"),
        (" 5/s", "'N/s', 'N/m'"),
        ("1000001/s", "at most 1000000/s"),
        (5, "must be a str"),
        (None, "must be a str"),
    ],
)
def test_a_bad_rate_is_a_value_error_naming_the_rule(rate: object, rule: str) -> None:
    with pytest.raises(ValueError, match=rule):
        parse_rate(rate)


def test_the_burst_defaults_to_the_rates_count() -> None:
    assert check_burst(None, parse_rate("100/m")) == 100
    assert check_burst(1, parse_rate("100/m")) == 1


@pytest.mark.parametrize(
    ("burst", "rule"),
    [
        (0, ">= 1"),
        (-3, ">= 1"),
        (True, "must be an int"),
        (2.0, "must be an int"),
        ("5", "must be an int"),
        (20_000, "to refill"),  # 20,000 days at 1/d
    ],
)
def test_a_bad_burst_is_a_value_error(burst: object, rule: str) -> None:
    with pytest.raises(ValueError, match=rule):
        check_burst(burst, parse_rate("1/d"))


@pytest.mark.parametrize(
    ("permits", "rule"), [(0, ">= 1"), (-1, ">= 1"), (11, "at most the burst"), (1.0, "an int")]
)
def test_permits_must_be_between_one_and_the_burst(permits: object, rule: str) -> None:
    with pytest.raises(ValueError, match=rule):
        check_take(permits, 10)
    assert check_take(10, 10) == 10


def test_the_key_is_in_the_names_slot_and_never_a_lock_key() -> None:
    for name in ("login:alice", "we{ir}d", "a}{b"):
        key = limiter_key("shop", name)
        lock = LockKeys.build("shop", name).hash
        assert key == lock + ":rate"
        assert key[key.index("{") : key.index("}") + 1] == lock[lock.index("{") :]  # one hash tag
        assert LockKeys.name_of("shop", key) is None  # `rlock list` never shows it
        assert limiter_name("shop", key) == name


def test_calls_carry_the_interval_burst_permits_and_longest_wait() -> None:
    limiter = RateLimiterBase("p", "n", "50/s", burst=10)
    assert repr(limiter) == "<RateLimiterBase 'n' 50/s burst=10>"
    assert limiter._reserve_call(2, None).args == ["20000.0", 10, 2, -1, 0]
    assert limiter._reserve_call(1, 0).args == ["20000.0", 10, 1, 0, 0]
    assert limiter._reserve_call(1, 1.5).args == ["20000.0", 10, 1, 1_500_000, 0]
    # try_acquire's: polite (it takes, or keeps, the polite callers' place); never waits.
    assert limiter._reserve_call(1, 0, polite=True).args == ["20000.0", 10, 1, 0, 1]
    with pytest.raises(ValueError, match="a polite reserve never waits"):
        limiter._reserve_call(1, 0.5, polite=True)
    assert limiter._wait_call(3).args == ["20000.0", 10, 3]
    assert limiter._reserve_call(1, 0).keys == ["p:{n}:rate"]
    with pytest.raises(ValueError, match="timeout must be >= 0"):
        limiter._reserve_call(1, -1)
    with pytest.raises(ValueError, match="at most the burst"):
        limiter._wait_call(11)


def test_replies_are_read_in_seconds() -> None:
    assert reservation([1, 0]) == (True, 0.0)
    assert reservation([1, 250_000]) == (True, 0.25)
    assert reservation([0, 1_500_001]) == (False, 1.500001)
    assert limiter_state("n", None) is None
    state = limiter_state("n", [b"150000", b"20000.0", b"10"])
    assert state == LimiterState(name="n", debt=0.15, interval=0.02, burst=10)


def test_the_state_an_operator_sees() -> None:
    # 50/s, burst 10, 7.5 permits' worth taken and not refilled yet.
    state = LimiterState(name="n", debt=0.15, interval=0.02, burst=10)
    assert state.rate == "50/s"
    assert state.available == 2
    assert state.next_in == 0.0
    assert state.full_in == 0.15
    drained = LimiterState(name="n", debt=0.25, interval=0.02, burst=10)
    assert drained.available == 0
    assert drained.next_in == pytest.approx(0.07)
    assert LimiterState(name="n", debt=0, interval=0.6, burst=100).rate == "100/m"
    # A kept place's permits, not booked yet, come before any reservation's.
    kept = limiter_state("n", [b"150000", b"20000.0", b"10", b"30000", b"2", b"0"])
    assert kept == LimiterState(
        name="n", debt=0.15, interval=0.02, burst=10, place_in=0.03, place=2
    )
    assert kept.held == pytest.approx(0.04) and kept.available == 0
    assert kept.next_in == pytest.approx(0.01)
    booked = limiter_state("n", [b"150000", b"20000.0", b"10", b"30000", b"2", b"1"])
    assert booked is not None and booked.held == 0.0 and booked.available == 2
    assert limiter_state("n", [b"150000", b"20000.0", b"10", b"", b"0", b"0"]) == state
    assert LimiterState(name="n", debt=0, interval=86400 / 7, burst=1).rate == "7/d"
