"""What each operation sends (KEYS and ARGV), matched against the script that reads it,
and what each reply means."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from django_rlock.core._protocol import catalog
from django_rlock.core._protocol.calls import (
    Grant,
    ScriptCall,
    abandon_call,
    acquire_call,
    acquire_reply,
    extend_call,
    force_release_call,
    hold_count_reply,
    release_call,
    ttl_reply,
)
from django_rlock.core._protocol.deadlocks import (
    REDISSON,
    SEMAPHORE,
    WRITE,
    Wait,
    read_call,
    read_hold_call,
)
from django_rlock.core._protocol.fairlock import (
    fair_abandon_call,
    fair_acquire_call,
    fair_keys,
    fair_release_call,
)
from django_rlock.core._protocol.names import MAX_NAME_BYTES, LockKeys, check_name
from django_rlock.core._protocol.ratelimit import (
    limiter_key,
    parse_rate,
    reserve_call,
    state_call,
    wait_call,
)
from django_rlock.core._protocol.redisson import (
    acquire_on,
    force_release_on,
    redisson_keys,
    release_on,
)
from django_rlock.core._protocol.rwlock import (
    RWKeys,
    read_acquire_call,
    read_force_release_call,
    read_release_call,
    readers_call,
    rw_abandon_call,
    write_acquire_call,
    write_force_release_call,
    write_release_call,
)
from django_rlock.core._protocol.semaphore import (
    permit_key,
    permit_prefix,
    semaphore_abandon_call,
    semaphore_acquire_call,
    semaphore_force_release_call,
    semaphore_keys,
    semaphore_release_call,
    semaphore_state_call,
)

pytestmark = pytest.mark.pure

SCRIPTS = catalog.scripts()
RID = "rid-1"
WAITER = "waiter-1"


def calls(prefix: str, name: str, owner: str) -> dict[str, ScriptCall]:
    """One call of every script, built as the engines build it (core/_sync/locks.py)."""
    plain = LockKeys.build(prefix, name)
    fair = fair_keys(prefix, name)
    rw = RWKeys.build(prefix, name)
    sem = semaphore_keys(prefix, name)
    shared = redisson_keys(prefix, name)  # layout="redisson" (tests/protocol/test_redisson.py)
    limiter = limiter_key(prefix, name)
    attempt: dict[str, Any] = {"ttl": 30.0, "waiter_id": WAITER, "sleep": 2.5, "rid": RID}
    write_latch = rw.for_write().latch(owner)
    read_latch = rw.for_read().latch(owner)
    return {
        "lock.acquire": acquire_call(plain, owner, **attempt, lost=(7, 2), holder="h"),
        "lock.release": release_call(plain, owner, "publish", RID),
        "lock.renew": extend_call(plain.hash, plain.fence, owner, 30.0),
        "lock.force_release": force_release_call(plain, "publish"),
        "lock.abandon": abandon_call(plain, WAITER, "publish"),
        "fairlock.acquire": fair_acquire_call(
            acquire_call(fair, owner, **attempt, holder="h"), fair, 30.0
        ),
        "fairlock.release": fair_release_call(release_call(fair, owner, "publish", RID), fair),
        "fairlock.abandon": fair_abandon_call(fair, WAITER, "publish"),
        "rwlock.read_acquire": read_acquire_call(
            rw, owner, **attempt, latch=read_latch, lost=False
        ),
        "rwlock.write_acquire": write_acquire_call(
            rw, owner, **attempt, latch=write_latch, lost=None, holder="h", read_lost=True
        ),
        "rwlock.read_release": read_release_call(rw, owner, "publish", RID, read_latch),
        "rwlock.write_release": write_release_call(rw, owner, "publish", RID, write_latch),
        "rwlock.abandon": rw_abandon_call(rw, WAITER, "publish"),
        "rwlock.read_force_release": read_force_release_call(rw, "publish"),
        "rwlock.write_force_release": write_force_release_call(rw, "publish"),
        "rwlock.readers": readers_call(rw),
        "semaphore.acquire": semaphore_acquire_call(sem, owner, permits=3, **attempt, holder="h"),
        "semaphore.release": semaphore_release_call(sem, owner, "publish", RID),
        "semaphore.abandon": semaphore_abandon_call(sem, WAITER, "publish", 3),
        "semaphore.state": semaphore_state_call(sem),
        "semaphore.force_release": semaphore_force_release_call(sem, "publish"),
        "redisson-lock.acquire": acquire_on(
            shared, owner, acquire_call(shared, owner, **attempt, lost=(7, 2), holder="h")
        ),
        "redisson-lock.release": release_on(
            shared, owner, release_call(shared, owner, "publish", RID)
        ),
        "redisson-lock.force_release": force_release_on(shared, "publish"),
        "ratelimit.reserve": reserve_call(limiter, parse_rate("50/s"), 10, 2, 0.5),
        "ratelimit.wait": wait_call(limiter, parse_rate("50/s"), 10, 2),
        "ratelimit.state": state_call(limiter),
        "deadlock.read_hold": read_hold_call(plain.hash),
        "deadlock.read_redisson": read_call(prefix, Wait(REDISSON, name))[1],
        "deadlock.read_rw": read_call(prefix, Wait(WRITE, rw.base))[1],
        "deadlock.read_semaphore": read_call(prefix, Wait(SEMAPHORE, sem.hash, 3))[1],
    }


def highest(body: str, table: str) -> int:
    """The highest ``KEYS[n]`` / ``ARGV[n]`` a script reads by number (0: none)."""
    return max((int(n) for n in re.findall(rf"\b{table}\[(\d+)\]", body)), default=0)


def test_every_script_has_a_call_here() -> None:
    # A script added to a kind must be matched to its builder below.
    assert set(calls("p", "n", "o")) == set(SCRIPTS)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_each_call_sends_exactly_the_keys_and_arguments_its_script_reads(
    script: str, owner: str
) -> None:
    call = calls("shop", "order:42", owner)[script]
    body = SCRIPTS[script]
    if script == "lock.renew":
        # RENEW reads its KEYS in pairs and ARGV[2 + i] per pair, by a loop.
        assert "#KEYS / 2" in body and "ARGV[i + 2]" in body
        assert len(call.keys) % 2 == 0
        assert len(call.args) == 2 + len(call.keys) // 2
        return
    assert len(call.keys) == highest(body, "KEYS"), call.keys
    assert len(call.args) == highest(body, "ARGV"), call.args


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_a_call_that_may_be_resent_carries_its_request_id_and_latch(
    script: str, owner: str
) -> None:
    call = calls("shop", "order:42", owner)[script]
    if script in ("lock.acquire", "lock.release"):
        # The plain lock latches in its hash ('~r'), and a final release in
        # the name's latches hash: no latch key per owner.
        assert call.rid == RID and RID in call.args
        assert call.keys[-1].endswith("}:req") and not any(":req:" in key for key in call.keys)
    elif call.rid:
        assert call.rid == RID and RID in call.args
        # The owner's latch: where a resent call finds its request id.
        assert any(key.endswith(f":req:{owner}") for key in call.keys)
    else:
        assert not any(":req:" in key for key in call.keys)


@settings(max_examples=60, deadline=None)
@given(
    name=st.text(alphabet=st.characters(blacklist_categories=["Cc", "Cs"]), min_size=1),
    prefix=st.sampled_from(["", "shop", "a:b", "%7B"]),
)
def test_every_key_every_call_sends_is_in_the_names_slot(name: str, prefix: str) -> None:
    """Redis Cluster runs a script only when all its keys are in one slot: the name's."""
    if len(name.encode()) > MAX_NAME_BYTES:
        return
    name = check_name(name)
    expected = key_slot(LockKeys.build(prefix, name).hash.encode())
    owner = "0123abcd:7"
    for script, call in calls(prefix, name, owner).items():
        if script.startswith("redisson-lock.") or script == "deadlock.read_redisson":
            continue  # keyed by the name itself: tests/protocol/test_redisson.py
        slots = {key_slot(key.encode()) for key in call.keys}
        assert slots == {expected}, (script, call.keys)


@pytest.mark.parametrize("name", ["{", "}", "{}", "}{", "a{b}c", "{x}{y}", "%7B", "plain"])
def test_keys_the_scripts_build_from_a_prefix_stay_in_the_slot_too(name: str) -> None:
    """The semaphore and the read side read other owners' keys from a prefix in ARGV."""
    expected = key_slot(LockKeys.build("shop", name).hash.encode())
    rw = RWKeys.build("shop", name)
    sem = semaphore_keys("shop", name)
    built = [
        rw.reader("any-owner"),
        rw.reader_prefix + "{other}",
        permit_key(sem, "any-owner"),
        permit_prefix(sem) + "}{",
        fair_keys("shop", name).queue,
        fair_keys("shop", name).entries,
    ]
    assert {key_slot(key.encode()) for key in built} == {expected}


def test_the_kinds_never_share_a_key_for_one_name(owner: str) -> None:
    """A lock, a fair lock, a read-write lock and a semaphore named alike are apart."""
    by_kind: dict[str, set[str]] = {}
    for script, call in calls("shop", "same", owner).items():
        if script.startswith("deadlock."):
            continue  # the detector reads the plain lock's keys: it is no kind of its own
        by_kind.setdefault(script.split(".")[0], set()).update(call.keys)
    kinds = sorted(by_kind)
    for i, kind in enumerate(kinds):
        for other in kinds[i + 1 :]:
            assert not by_kind[kind] & by_kind[other], (kind, other)


def test_expiries_and_sleeps_go_as_whole_milliseconds_rounded_up(owner: str) -> None:
    keys = LockKeys.build("p", "n")
    call = acquire_call(keys, owner, ttl=1.0001, waiter_id="", sleep=0.0000001, rid=RID)
    assert call.args[:5] == [owner, 1001, "", 1, RID]
    assert extend_call(keys.hash, keys.fence, owner, 0.25).args == [250, 1, owner]


def test_an_acquire_names_the_lost_holds_it_takes_off_first(owner: str) -> None:
    keys = LockKeys.build("p", "n")
    fresh = acquire_call(keys, owner, ttl=1, waiter_id="", sleep=1, rid=RID)
    after_loss = acquire_call(keys, owner, ttl=1, waiter_id="", sleep=1, rid=RID, lost=(42, 3))
    assert fresh.args[5:7] == [0, "0"]  # ARGV[6] holds lost, ARGV[7] their token
    assert after_loss.args[5:7] == [3, "42"]


def test_a_fair_call_is_the_plain_call_plus_the_queue(owner: str) -> None:
    keys = fair_keys("p", "n")
    plain = acquire_call(keys, owner, ttl=1, waiter_id=WAITER, sleep=1, rid=RID)
    fair = fair_acquire_call(plain, keys, watchdog_timeout=4.5)
    # The fair lock keeps its fencing counter and latches in keys of their own.
    counter_keys = [keys.hash, keys.fence, keys.waiters, keys.latch(owner)]
    assert fair.keys == [*counter_keys, keys.queue, keys.entries]
    assert fair.args == [*plain.args, 4500]  # a handed grant's life: the watchdog timeout
    assert fair.rid == plain.rid


# -- replies --------------------------------------------------------------------------


def test_a_list_reply_is_a_grant() -> None:
    assert acquire_reply([17, 1, 29_998], no_expiry_wait=5.0) == Grant(17, 1, 29_998)
    # As RESP2 hands them over, too.
    assert acquire_reply([b"18", b"2", b"100"], no_expiry_wait=5.0) == Grant(18, 2, 100)


@pytest.mark.parametrize(
    ("pttl_ms", "wait"),
    [
        (2500, 2.5),  # wait out the holder's life left, at most
        (1, 0.001),
        (0, 0.001),  # the key expires now: retry soon, never a busy loop of zero waits
        (-1, 7.0),  # a key with no expiry (set by hand): look again after no_expiry_wait
        (b"750", 0.75),
    ],
)
def test_an_integer_reply_is_the_longest_wait_before_trying_again(
    pttl_ms: int | bytes, wait: float
) -> None:
    assert acquire_reply(pttl_ms, no_expiry_wait=7.0) == pytest.approx(wait)


@pytest.mark.parametrize(
    ("pttl_ms", "ttl"), [(-2, None), (-1, math.inf), (1500, 1.5), (b"20", 0.02)]
)
def test_a_pttl_reply_is_what_ttl_answers(pttl_ms: int | bytes, ttl: float | None) -> None:
    assert ttl_reply(pttl_ms) == ttl


@pytest.mark.parametrize(("reply", "count"), [(None, 0), (b"3", 3), (1, 1)])
def test_a_hold_count_reply(reply: object, count: int) -> None:
    assert hold_count_reply(reply) == count
