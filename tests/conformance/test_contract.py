"""The lock contract (the public contract: docs/engine.md), once, for every engine.

Each rule runs against every engine it applies to (see conftest.ENGINES). Two
owners ``a`` and ``b`` are two threads for the sync engines, two asyncio tasks
for the asyncio ones.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import pytest

from django_rlock.core import LockError, LockLostError, LockNotOwnedError, LockTimeout
from tests.conformance.conftest import engines
from tests.conformance.drivers import HANG, Driver, Engine

Connect = Callable[..., Driver]

#: The known asyncio drift: owned()/hold_count() read this process's record
#: instead of asking Redis (issue 13; the `sansio` branch removes it).

# -- with: every engine, including `async with rlock()` on every backend ---------------


@pytest.mark.parametrize("engine", engines(full_api=False))
def test_with_excludes_others_reenters_and_frees(connect: Connect, engine: Engine) -> None:
    driver = connect(engine)
    a, b = driver.owners(2)
    lock = driver.lock("with", timeout=0.2)
    a.call(lock, "enter")
    a.call(lock, "enter")  # re-entry by the same owner never waits
    with pytest.raises(LockTimeout):
        b.call(driver.lock("with", timeout=0.2), "enter")
    a.call(lock, "exit")
    with pytest.raises(LockTimeout):  # one hold is left
        b.call(driver.lock("with", timeout=0.2), "enter")
    a.call(lock, "exit")
    other = driver.lock("with", timeout=0.2)
    b.call(other, "enter")
    b.call(other, "exit")


@pytest.mark.parametrize("engine", engines(full_api=False))
def test_with_yields_the_lock_and_its_token(connect: Connect, engine: Engine) -> None:
    driver = connect(engine)
    (a,) = driver.owners(1)
    lock = driver.lock("yielded")
    entered = a.call(lock, "enter")
    try:
        assert isinstance(a.call(entered, "token"), int)
        assert a.call(entered, "lost") is False
    finally:
        a.call(lock, "exit")


@pytest.mark.parametrize("engine", engines(full_api=False))
def test_with_non_blocking_raises_at_once(connect: Connect, engine: Engine) -> None:
    driver = connect(engine)
    a, b = driver.owners(2)
    a.call(driver.lock("nbwith", lease=30), "enter")
    started = time.monotonic()
    with pytest.raises(LockTimeout) as busy:
        b.call(driver.lock("nbwith", blocking=False), "enter")
    assert time.monotonic() - started < 1.0
    # It says it made one attempt (it once said "within Nones").
    assert "blocking=False" in str(busy.value) and "None" not in str(busy.value)


@pytest.mark.parametrize("engine", engines(full_api=False))
def test_with_waits_up_to_its_timeout(connect: Connect, engine: Engine) -> None:
    driver = connect(engine)
    a, b = driver.owners(2)
    a.call(driver.lock("busy", lease=30), "enter")
    started = time.monotonic()
    with pytest.raises(LockTimeout) as busy:
        b.call(driver.lock("busy", timeout=0.4), "enter")
    waited = time.monotonic() - started
    assert 0.35 <= waited < HANG
    # The holder's remaining lease, for a Retry-After.
    assert busy.value.retry_after is not None and 25 < busy.value.retry_after <= 30


# -- the RLock API: engines whose lock objects have it (not the async adapter) ---------


@pytest.mark.parametrize("engine", engines())
def test_acquire_release_and_inspect(connect: Connect, engine: Engine) -> None:
    driver = connect(engine)
    (a,) = driver.owners(1)
    lock = driver.lock("plain")
    assert a.call(lock, "locked") is False
    assert a.call(lock, "owned") is False
    assert a.call(lock, "hold_count") == 0
    assert a.call(lock, "token") is None
    assert a.call(lock, "acquire") is True
    assert a.call(lock, "locked") is True
    assert a.call(lock, "owned") is True
    assert a.call(lock, "hold_count") == 1
    assert isinstance(a.call(lock, "token"), int)
    a.call(lock, "release")
    assert a.call(lock, "locked") is False
    assert a.call(lock, "owned") is False
    assert a.call(lock, "hold_count") == 0
    assert a.call(lock, "token") is None
    assert a.call(lock, "lost") is False


@pytest.mark.parametrize("engine", engines())
def test_non_blocking_acquire_makes_one_attempt(connect: Connect, engine: Engine) -> None:
    driver = connect(engine)
    a, b = driver.owners(2)
    lock = driver.lock("nb")
    assert a.call(lock, "acquire", lease=30) is True
    started = time.monotonic()
    assert b.call(lock, "acquire", blocking=False) is False
    assert time.monotonic() - started < 1.0  # one round trip, no wait for the 30 s lease
    assert b.call(lock, "owned") is False
    assert b.call(lock, "hold_count") == 0
    assert a.call(lock, "hold_count") == 1


@pytest.mark.parametrize("engine", engines())
def test_acquire_timeout_gives_up_after_it(connect: Connect, engine: Engine) -> None:
    driver = connect(engine)
    a, b = driver.owners(2)
    lock = driver.lock("to")
    assert a.call(lock, "acquire", lease=30) is True
    started = time.monotonic()
    assert b.call(lock, "acquire", timeout=0.4) is False
    assert 0.35 <= time.monotonic() - started < HANG
    assert b.call(lock, "owned") is False
    assert a.call(lock, "owned") is True


@pytest.mark.parametrize("engine", engines())
def test_lease_expires_and_the_next_owner_gets_the_lock(connect: Connect, engine: Engine) -> None:
    driver = connect(engine)
    a, b = driver.owners(2)
    lock = driver.lock("lease")
    assert a.call(lock, "acquire", lease=0.4) is True
    started = time.monotonic()
    assert b.call(lock, "acquire", timeout=HANG) is True
    # At the lease's end (the waiter never waits longer than the holder's PTTL).
    assert 0.25 <= time.monotonic() - started < 3.0
    assert b.call(lock, "owned") is True
    assert a.call(lock, "owned") is False
    assert a.call(lock, "lost") is True
    with pytest.raises(LockLostError):
        a.call(lock, "release")
    assert b.call(lock, "hold_count") == 1  # a's late release took nothing from b
    b.call(lock, "release")


@pytest.mark.parametrize("engine", engines())
def test_reentry_counts_holds_and_keeps_the_token(connect: Connect, engine: Engine) -> None:
    driver = connect(engine)
    (a,) = driver.owners(1)
    lock = driver.lock("re")
    assert a.call(lock, "acquire") is True
    token = a.call(lock, "token")
    assert a.call(lock, "acquire", blocking=False) is True
    assert a.call(lock, "acquire", timeout=0.1) is True
    assert a.call(lock, "hold_count") == 3
    assert a.call(lock, "token") == token
    a.call(lock, "release")
    assert a.call(lock, "hold_count") == 2
    assert a.call(lock, "owned") is True
    assert a.call(lock, "token") == token
    a.call(lock, "release")
    assert a.call(lock, "locked") is True
    a.call(lock, "release")
    assert a.call(lock, "locked") is False
    assert a.call(lock, "hold_count") == 0


@pytest.mark.parametrize("engine", engines())
def test_another_owner_sees_locked_but_not_owned(connect: Connect, engine: Engine) -> None:
    driver = connect(engine)
    a, b = driver.owners(2)
    lock = driver.lock("seen")
    assert a.call(lock, "acquire") is True
    assert b.call(lock, "locked") is True
    assert b.call(lock, "owned") is False
    assert b.call(lock, "hold_count") == 0
    assert b.call(lock, "token") is None
    # A second lock object of the same name is the same lock.
    same = driver.lock("seen")
    assert a.call(same, "owned") is True
    assert a.call(same, "hold_count") == 1
    assert b.call(same, "owned") is False


@pytest.mark.parametrize("engine", engines())
def test_ttl(connect: Connect, engine: Engine) -> None:
    driver = connect(engine)
    a, b = driver.owners(2)
    lock = driver.lock("ttl")
    assert a.call(lock, "ttl") is None
    assert a.call(lock, "acquire", lease=10) is True
    ttl = b.call(lock, "ttl")
    assert ttl is not None and 8 < ttl <= 10
    a.call(lock, "release")
    assert a.call(lock, "ttl") is None
    assert a.call(lock, "acquire") is True  # the watchdog's: at most its timeout
    ttl = b.call(lock, "ttl")
    assert ttl is not None and not math.isinf(ttl) and 0 < ttl <= driver.watchdog_timeout
    a.call(lock, "release")


@pytest.mark.parametrize("engine", engines())
def test_tokens_strictly_increase_across_grants(connect: Connect, engine: Engine) -> None:
    driver = connect(engine)
    a, b = driver.owners(2)
    lock = driver.lock("fence")
    seen = []
    for owner in (a, b, a, b):
        assert owner.call(lock, "acquire") is True
        seen.append(owner.call(lock, "token"))
        owner.call(lock, "release")
    # A force-release between grants does not reset the count either.
    assert a.call(lock, "acquire") is True
    seen.append(a.call(lock, "token"))
    assert b.call(lock, "force_release") is True
    assert b.call(lock, "acquire") is True
    seen.append(b.call(lock, "token"))
    assert all(isinstance(token, int) for token in seen)
    assert seen == sorted(set(seen)), seen


@pytest.mark.parametrize("engine", engines())
def test_force_release_frees_a_lock_held_by_another(connect: Connect, engine: Engine) -> None:
    driver = connect(engine)
    a, b = driver.owners(2)
    lock = driver.lock("forced")
    assert b.call(lock, "force_release") is False  # nobody held it
    assert a.call(lock, "acquire", lease=30) is True
    assert b.call(lock, "force_release") is True
    assert b.call(lock, "locked") is False
    assert b.call(lock, "acquire", blocking=False) is True
    with pytest.raises(LockLostError):
        a.call(lock, "release")
    assert b.call(lock, "hold_count") == 1


@pytest.mark.parametrize("engine", engines())
def test_release_of_a_lock_not_held_changes_nothing(connect: Connect, engine: Engine) -> None:
    driver = connect(engine)
    a, b = driver.owners(2)
    lock = driver.lock("notmine")
    with pytest.raises(LockNotOwnedError) as never_held:
        a.call(lock, "release")
    assert not isinstance(never_held.value, LockLostError)  # never held: not "lost"
    assert a.call(lock, "locked") is False

    assert b.call(lock, "acquire", lease=30) is True
    token = b.call(lock, "token")
    with pytest.raises(LockNotOwnedError) as held_by_b:
        a.call(lock, "release")
    assert not isinstance(held_by_b.value, LockLostError)
    assert b.call(lock, "hold_count") == 1
    assert b.call(lock, "token") == token
    ttl = b.call(lock, "ttl")
    assert ttl is not None and ttl > 25
    assert a.call(lock, "lost") is False
    b.call(lock, "release")
    assert b.call(lock, "locked") is False


@pytest.mark.parametrize("engine", engines())
def test_owned_answers_from_the_lock_not_a_local_record(connect: Connect, engine: Engine) -> None:
    # A fixed lease, so no renewal can notice the loss first: owned() and
    # hold_count() must say what the lock says, at once.
    driver = connect(engine)
    a, b = driver.owners(2)
    lock = driver.lock("ownedq")
    assert a.call(lock, "acquire", lease=30) is True
    assert b.call(lock, "force_release") is True
    assert a.call(lock, "owned") is False
    assert a.call(lock, "hold_count") == 0


@pytest.mark.parametrize(
    "bad",
    [
        {"timeout": -1},
        {"lease": 0},
        {"lease": float("nan")},
        {"timeout": "1"},
        {"blocking": False, "timeout": 1},
    ],
    ids=["negative-timeout", "zero-lease", "nan-lease", "str-timeout", "non-blocking-with-timeout"],
)
@pytest.mark.parametrize("engine", engines())
def test_bad_arguments_are_value_errors_and_hold_nothing(
    connect: Connect, engine: Engine, bad: dict[str, object]
) -> None:
    driver = connect(engine)
    (a,) = driver.owners(1)
    lock = driver.lock("bad")
    with pytest.raises(ValueError):  # noqa: PT011 -- the message differs per argument
        a.call(lock, "acquire", **bad)
    assert a.call(lock, "locked") is False
    with pytest.raises(ValueError, match="name"):
        driver.lock("")


@pytest.mark.parametrize("engine", engines())
def test_reentry_never_shortens_the_lock(connect: Connect, engine: Engine) -> None:
    driver = connect(engine)
    (a,) = driver.owners(1)
    lock = driver.lock("longer")
    assert a.call(lock, "acquire", lease=10) is True
    assert a.call(lock, "acquire", lease=1) is True
    assert a.call(lock, "ttl") > 8
    assert a.call(lock, "acquire") is True  # a watchdog hold joins the fixed lease
    assert a.call(lock, "ttl") > 8


@pytest.mark.parametrize("engine", engines())
def test_each_nested_hold_of_a_lost_lock_reports_the_loss(connect: Connect, engine: Engine) -> None:
    driver = connect(engine)
    a, b = driver.owners(2)
    lock = driver.lock("nested")
    assert a.call(lock, "acquire") is True
    assert a.call(lock, "acquire") is True
    assert b.call(lock, "force_release") is True
    with pytest.raises(LockLostError):
        a.call(lock, "release")
    with pytest.raises(LockLostError):  # the outer `with` learns it too
        a.call(lock, "release")
    with pytest.raises(LockNotOwnedError) as third:
        a.call(lock, "release")
    assert not isinstance(third.value, LockLostError)
    assert a.call(lock, "lost") is True


# -- extend(): moving a fixed lease (DESIGN, "Public contract, second part") -----


@pytest.mark.parametrize("engine", engines())
def test_extend_moves_the_fixed_lease_either_way(connect: Connect, engine: Engine) -> None:
    driver = connect(engine)
    a, b = driver.owners(2)
    lock = driver.lock("extended")
    assert a.call(lock, "acquire", lease=2) is True
    a.call(lock, "extend", 30)
    assert 28 < a.call(lock, "ttl") <= 30
    a.call(lock, "extend", 0.3)  # shorter: the lease now ends sooner
    assert a.call(lock, "ttl") <= 0.3
    assert b.call(lock, "acquire", timeout=HANG) is True  # it expired: b holds it
    assert a.call(lock, "lost") is True
    with pytest.raises(LockLostError):
        a.call(lock, "extend", 5)
    with pytest.raises(LockNotOwnedError) as not_held:
        driver.owners(1)[0].call(lock, "extend", 5)
    assert not isinstance(not_held.value, LockLostError)
    b.call(lock, "release")


@pytest.mark.parametrize("engine", engines())
def test_extend_refuses_a_watchdog_hold_and_bad_seconds(connect: Connect, engine: Engine) -> None:
    driver = connect(engine)
    (a,) = driver.owners(1)
    lock = driver.lock("renewed")
    assert a.call(lock, "acquire") is True
    with pytest.raises(LockError, match="watchdog"):
        a.call(lock, "extend", 5)
    for bad in (0, -1, math.inf, None):
        with pytest.raises(ValueError):  # noqa: PT011 -- each bad value words it its own way
            a.call(lock, "extend", bad)
    assert a.call(lock, "owned") is True  # nothing changed
    a.call(lock, "release")
