"""The hold registry's bookkeeping: grants, re-entries, deadlines, releases, losses, leaks.

A lock here is a stand-in with the few attributes the registry reads (every
kind has them); replies are given as the scripts give them (token, holds,
PTTL). Time is the protocol's clock seam, set by the tests.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from django_rlock.core._process import lostholds
from django_rlock.core._protocol import clock
from django_rlock.core._protocol.holds import GaveUp, Hold, HoldRegistry, key_deadline
from django_rlock.core._protocol.names import LockKeys

pytestmark = pytest.mark.pure

#: Seconds a test waits for an on_lost callback's thread: only reached when it hangs.
HANG = 10.0


@dataclass(eq=False)
class StubLock:
    keys: LockKeys
    max_hold: float | None = None
    key_template: str | None = None
    lost_callbacks: list[Callable[[Any], object]] = field(default_factory=list)
    given_back: list[Hold] = field(default_factory=list)

    def hold_keys(self, owner: str) -> tuple[str, str]:
        return self.keys.hash, self.keys.fence

    def give_back_leaked(self, hold: Hold) -> None:
        self.given_back.append(hold)


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The protocol's clock: ``now[0]`` is the monotonic time it reads."""
    moment = [100.0]
    monkeypatch.setattr(clock, "monotonic", lambda: moment[0])
    return moment


@pytest.fixture
def lock(owner: str) -> StubLock:
    return StubLock(LockKeys.build("p", f"orders-{owner}"))


class Events:
    """Every event a registry tells, in order."""

    def __init__(self, registry: HoldRegistry) -> None:
        self.seen: list[tuple[str, Any]] = []
        self.lost = threading.Event()
        registry.on_acquired(lambda hold: self.seen.append(("acquired", hold)))
        registry.on_released(lambda hold: self.seen.append(("released", hold)))
        registry.on_gave_up(lambda gave_up: self.seen.append(("gave up", gave_up)))
        registry.on_leaked(lambda hold, why: self.seen.append(("leaked", (hold, why))))
        registry.on_lost(self._lost)

    def _lost(self, hold: Hold) -> None:
        self.seen.append(("lost", hold))
        self.lost.set()

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.seen]


def grant(registry: HoldRegistry, lock: StubLock, owner: str, **reply: Any) -> Hold:
    """Record a grant as the acquire script replies it (defaults: a first watchdog grant)."""
    options: dict[str, Any] = {"token": 7, "holds": 1, "lease": None, "sent_at": 100.0}
    options["pttl_ms"] = 30_000
    return registry.grant(lock, owner, **{**options, **reply})


def test_a_deadline_is_the_send_time_plus_the_pttl_less_the_drift_allowance() -> None:
    # 30 s of life: 1 % + 2 ms are not counted on (Redis expires by its own clock).
    assert key_deadline(100.0, 30_000) == pytest.approx(130.0 - 0.302)
    assert key_deadline(100.0, 1) == pytest.approx(100.001 - 0.00201)
    assert key_deadline(100.0, -1) == math.inf  # no expiry: set by hand


def test_a_grant_then_a_reentry_is_one_hold_counted_twice(
    now: list[float], lock: StubLock, owner: str
) -> None:
    registry = HoldRegistry()
    events = Events(registry)
    first = grant(registry, lock, owner, token=7, sent_at=100.0, pttl_ms=30_000)
    assert (first.token, first.count, first.watchdog) == (7, 1, True)
    assert first.deadline == pytest.approx(key_deadline(100.0, 30_000))
    now[0] = 110.0
    again = grant(registry, lock, owner, token=7, holds=2, sent_at=110.0, pttl_ms=30_000)
    assert again is first and first.count == 2
    assert first.deadline == pytest.approx(key_deadline(110.0, 30_000))
    assert events.kinds() == ["acquired"]  # a re-entry is no new hold
    assert registry.holds_of(lock.keys.hash, owner) == [first]


def test_a_later_reply_never_moves_a_deadline_earlier(lock: StubLock, owner: str) -> None:
    registry = HoldRegistry()
    hold = grant(registry, lock, owner, sent_at=100.0, pttl_ms=30_000)
    before = hold.deadline
    registry.extend(hold, sent_at=95.0, pttl_ms=30_000)  # an older renewal's late reply
    assert hold.deadline == before
    registry.extend(hold, sent_at=120.0, pttl_ms=30_000)
    assert hold.deadline == pytest.approx(key_deadline(120.0, 30_000))
    registry.set_deadline(hold, sent_at=121.0, pttl_ms=1_000)  # shortened on purpose
    assert hold.deadline == pytest.approx(key_deadline(121.0, 1_000))


def test_a_grant_says_how_long_its_caller_waited(
    now: list[float], lock: StubLock, owner: str
) -> None:
    registry = HoldRegistry()
    now[0] = 103.5
    hold = grant(registry, lock, owner, sent_at=103.0, requested_at=100.0)
    assert hold.waited == pytest.approx(3.5)
    assert hold.acquired_at == 103.0


def test_holds_are_released_one_by_one_and_told_at_the_last(lock: StubLock, owner: str) -> None:
    registry = HoldRegistry()
    events = Events(registry)
    hold = grant(registry, lock, owner)
    grant(registry, lock, owner, holds=2)
    assert registry.start_release(lock.keys.hash, owner) is hold
    assert not hold.releasing  # not the last hold
    registry.released(hold, left=1)
    assert hold.count == 1 and events.kinds() == ["acquired"]
    assert registry.start_release(lock.keys.hash, owner) is hold
    assert hold.releasing
    registry.released(hold, left=0)
    assert hold.released and events.kinds() == ["acquired", "released"]
    assert registry.holds_of(lock.keys.hash, owner) == []
    assert registry.start_release(lock.keys.hash, owner) is None


def test_the_watchdog_is_started_by_the_first_watchdog_hold_only(
    lock: StubLock, owner: str
) -> None:
    started: list[int] = []
    registry = HoldRegistry(watch=lambda: started.append(1))
    leased = grant(registry, lock, owner, lease=10.0)
    assert not leased.watchdog and started == []  # a lease ends by itself
    other = StubLock(LockKeys.build("p", f"other-{owner}"))
    grant(registry, other, owner)
    grant(registry, other, owner, holds=2)
    assert started == [1]
    assert registry.watched_holds() == registry.holds_of(other.keys.hash, owner)


def test_a_lost_hold_is_told_recorded_for_the_next_acquire_and_no_longer_renewed(
    lock: StubLock, owner: str
) -> None:
    registry = HoldRegistry()
    events = Events(registry)
    by_lock = threading.Event()
    lock.lost_callbacks.append(lambda told: by_lock.set() if told is lock else None)
    hold = grant(registry, lock, owner, token=11)
    grant(registry, lock, owner, token=11, holds=2)
    registry.declare_lost(hold, "a renewal found the key gone")
    assert hold.lost
    assert registry.watched_holds() == []
    assert by_lock.wait(HANG) and events.lost.wait(HANG)
    # The owner's next acquire takes both holds off the server first.
    assert lostholds.lost_on_server(lock.keys.hash, owner) == (11, 2)
    registry.declare_lost(hold, "again")  # once only
    fresh = grant(registry, lock, owner, token=12)
    assert fresh is not hold and fresh.count == 1
    assert lostholds.lost_on_server(lock.keys.hash, owner) is None  # taken off by that grant
    assert registry.newest(lock.keys.hash, owner) is fresh
    assert events.kinds().count("lost") == 1


def test_a_fresh_grant_while_a_hold_was_believed_live_reports_the_old_one_lost(
    lock: StubLock, owner: str
) -> None:
    # Redis granted anew (holds == 1): the old hold expired unnoticed (a long pause).
    registry = HoldRegistry()
    events = Events(registry)
    old = grant(registry, lock, owner, token=1)
    new = grant(registry, lock, owner, token=2, holds=1)
    assert new is not old and old.lost and not new.lost
    assert events.lost.wait(HANG)
    assert registry.newest(lock.keys.hash, owner) is new


def test_a_renewal_racing_the_owners_last_release_is_not_a_loss(lock: StubLock, owner: str) -> None:
    registry = HoldRegistry()
    hold = grant(registry, lock, owner)
    registry.start_release(lock.keys.hash, owner)
    registry.declare_lost(hold, "a renewal found the key gone")
    assert not hold.lost
    registry.declare_lost(hold, "the owner's release found it gone", by_owner=True)
    assert hold.lost


def test_only_a_watchdog_hold_can_leak_and_only_once(lock: StubLock, owner: str) -> None:
    registry = HoldRegistry()
    events = Events(registry)
    leased = grant(registry, lock, owner, lease=5.0)
    assert registry.report_leaked(leased, "thread ended") is False
    other = StubLock(LockKeys.build("p", f"watched-{owner}"))
    watched = grant(registry, other, owner)
    assert registry.report_leaked(watched, "thread ended") is True
    assert registry.report_leaked(watched, "thread ended") is False
    assert [what for kind, what in events.seen if kind == "leaked"] == [(watched, "thread ended")]
    assert registry.watched_holds() == []  # the watchdog stops renewing it


def test_a_release_whose_outcome_is_unknown_drops_the_hold_and_remembers_it(
    lock: StubLock, owner: str
) -> None:
    registry = HoldRegistry()
    events = Events(registry)
    hold = grant(registry, lock, owner, token=21)
    registry.start_release(lock.keys.hash, owner)
    assert registry.release_failed(hold) is True
    assert hold.released and not hold.releasing
    assert events.kinds() == ["acquired", "released"]
    # It may have run or not: the next acquire takes it off first.
    assert lostholds.lost_on_server(lock.keys.hash, owner) == (21, 1)


def test_holds_the_server_counts_beyond_the_clients_are_remembered(
    lock: StubLock, owner: str
) -> None:
    # A re-entry whose reply never came: the server counts one hold more.
    registry = HoldRegistry()
    hold = grant(registry, lock, owner, token=31)
    registry.released(hold, left=1)
    assert hold.released
    assert lostholds.lost_on_server(lock.keys.hash, owner) == (31, 1)


def test_an_acknowledged_lost_hold_is_given_back_one_hold_at_a_time(
    lock: StubLock, owner: str
) -> None:
    registry = HoldRegistry()
    events = Events(registry)
    hold = grant(registry, lock, owner)
    grant(registry, lock, owner, holds=2)
    registry.declare_lost(hold, "gone")
    assert registry.acknowledge_lost(hold) is False
    assert registry.acknowledge_lost(hold) is True
    released = [what for kind, what in events.seen if kind == "released"]
    assert released == [hold] and hold.lost  # a release event, marked lost


def test_abandoning_the_watched_holds_declares_them_lost_and_rearms_the_watch(
    lock: StubLock, owner: str
) -> None:
    started: list[int] = []
    registry = HoldRegistry(watch=lambda: started.append(1))
    hold = grant(registry, lock, owner)
    registry.note_unanswered(lock.keys.hash, owner, "acquire", "rid-1")
    registry.abandon_watched("the client was closed")
    assert hold.lost
    assert registry.take_unanswered(lock.keys.hash, owner, "acquire") is None
    other = StubLock(LockKeys.build("p", f"next-{owner}"))
    grant(registry, other, owner)
    assert started == [1, 1]


def test_an_unanswered_call_id_is_taken_once(lock: StubLock, owner: str) -> None:
    registry = HoldRegistry()
    registry.note_unanswered(lock.keys.hash, owner, "release", "rid-7")
    assert registry.take_unanswered(lock.keys.hash, owner, "acquire") is None
    assert registry.take_unanswered(lock.keys.hash, owner, "release") == "rid-7"
    assert registry.take_unanswered(lock.keys.hash, owner, "release") is None


def test_an_acquire_that_got_nothing_is_told_with_its_wait(
    now: list[float], lock: StubLock, owner: str
) -> None:
    registry = HoldRegistry()
    events = Events(registry)
    now[0] = 102.5
    registry.gave_up(lock, owner, requested_at=100.0, would_wait=False)
    ((kind, told),) = events.seen
    assert kind == "gave up"
    assert told == GaveUp(
        name=lock.keys.name, key=lock.keys.hash, owner=owner, lock=lock, waited=2.5,
        would_wait=False,
    )  # fmt: skip


def test_a_tighter_max_hold_of_a_reentry_bounds_the_hold(owner: str) -> None:
    registry = HoldRegistry()
    keys = LockKeys.build("p", f"bounded-{owner}")
    hold = grant(registry, StubLock(keys, max_hold=60.0), owner)
    grant(registry, StubLock(keys, max_hold=None), owner, holds=2)
    assert hold.max_hold == 60.0
    grant(registry, StubLock(keys, max_hold=10.0), owner, holds=3)
    assert hold.max_hold == 10.0
    grant(registry, StubLock(keys, max_hold=30.0), owner, holds=4)
    assert hold.max_hold == 10.0


def test_the_holds_of_an_owner_are_its_live_ones(owner: str) -> None:
    registry = HoldRegistry()
    live = grant(registry, StubLock(LockKeys.build("p", f"a-{owner}")), owner)
    lost = grant(registry, StubLock(LockKeys.build("p", f"b-{owner}")), owner)
    done = grant(registry, StubLock(LockKeys.build("p", f"c-{owner}")), owner)
    grant(registry, StubLock(LockKeys.build("p", f"a-{owner}")), "someone else")
    registry.declare_lost(lost, "gone")
    registry.released(done, left=0)
    assert registry.holds_owned_by(owner) == [live]


def test_a_failing_subscriber_breaks_neither_the_grant_nor_the_others(
    lock: StubLock, owner: str, caplog: pytest.LogCaptureFixture
) -> None:
    registry = HoldRegistry()

    def broken(hold: Hold) -> None:
        raise RuntimeError("subscriber bug")

    registry.on_acquired(broken)
    told: list[Hold] = []
    registry.on_acquired(told.append)
    with caplog.at_level(logging.ERROR, logger="django_rlock.lock"):
        hold = grant(registry, lock, owner)
    assert told == [hold]
    assert "subscriber bug" in caplog.text
    registry.unsubscribe(broken, told.append)
    grant(registry, StubLock(LockKeys.build("p", f"after-{owner}")), owner)
    assert told == [hold]
