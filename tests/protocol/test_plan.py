"""The acquire plan: what a shell is told to do, in which order, and for how long.

A scripted shell records every step and answers as a server would; time is
the protocol's clock seam (core/_protocol/clock.py), moved by the shell, so
the waits are checked to the millisecond without sleeping.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from django_rlock.core._protocol import clock
from django_rlock.core._protocol.plan import (
    HANDED,
    SUBSCRIBED,
    AcquirePlan,
    drive,
    drive_async,
)

pytestmark = pytest.mark.pure

#: What a subscription's mark returns: the wake-up count a later wait compares against.
MARK = 41


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(clock, "monotonic", fake)
    return fake


class Shell:
    """Answers each attempt from ``replies`` (None: granted; seconds: the holder's PTTL).

    A wait answers ``woken`` and lets ``elapse`` seconds pass on the clock.
    """

    def __init__(
        self, now: FakeClock, replies: list[float | None], *, woken: object = True,
        elapse: float = 0.0,
    ) -> None:  # fmt: skip
        self.now = now
        self.replies = list(replies)
        self.woken = woken
        self.elapse = elapse
        self.steps: list[tuple[Any, ...]] = []
        self.subscription = self

    def attempt(self, waiter: bool, sleep: float) -> float | None:
        self.steps.append(("attempt", waiter, sleep))
        return self.replies.pop(0)

    def listen(self) -> None:
        self.steps.append(("listen",))

    def wait_subscribed(self, timeout: float) -> None:
        self.steps.append(("wait_subscribed", timeout))

    def mark(self) -> int:
        self.steps.append(("mark",))
        return MARK

    def wait(self, since: int, timeout: float) -> object:
        assert since == MARK  # the mark taken before this round's attempt
        self.steps.append(("wait", timeout))
        self.now.now += min(self.elapse, timeout)
        return self.woken


def plan(
    wait: float | None = None, *, blocking: bool = True, watchdog: float = 30.0
) -> AcquirePlan:
    return AcquirePlan(blocking=blocking, wait=wait, watchdog_timeout=watchdog)


def test_a_free_lock_takes_one_attempt_as_a_non_waiter(now: FakeClock) -> None:
    shell = Shell(now, [None])
    made = plan()
    assert drive(made, shell) is True
    assert shell.steps == [("attempt", False, 0.0)]
    assert made.registered is False


@pytest.mark.parametrize(
    "options", [{"blocking": False}, {"wait": 0}], ids=["non-blocking", "zero-wait"]
)
def test_a_busy_lock_without_waiting_is_one_attempt_and_no_subscription(
    now: FakeClock, options: dict[str, Any]
) -> None:
    shell = Shell(now, [5.0])
    made = plan(**options)
    assert drive(made, shell) is False
    assert shell.steps == [("attempt", False, 0.0)]
    assert made.registered is False  # never entered the waiting set: nothing to leave


def test_a_waiter_subscribes_and_has_it_confirmed_before_it_retries(now: FakeClock) -> None:
    shell = Shell(now, [2.0, 1.5, None])
    made = plan(wait=10)
    assert drive(made, shell) is True
    assert shell.steps == [
        ("attempt", False, 0.0),
        ("listen",),
        ("wait_subscribed", 2.0),  # no longer than the holder's PTTL
        ("mark",),
        ("attempt", True, 2.0),  # as a waiter, announcing its longest sleep
        ("wait", 1.5),  # woken by a release, or the holder's PTTL at the latest
        ("wait_subscribed", 1.5),
        ("mark",),
        ("attempt", True, 1.5),
    ]
    assert made.registered is False  # the grant took it out of the waiting set


def test_a_waiter_subscribed_already_sends_its_registered_attempt_first(now: FakeClock) -> None:
    # Its channels linger from its last wait: no attempt that does not wait.
    shell = Shell(now, [1.5, None])
    made = plan(wait=10, watchdog=3.0)
    assert drive(made, shell, SUBSCRIBED) is True
    assert shell.steps == [
        ("listen",),
        ("wait_subscribed", 3.0),  # the holder's PTTL unknown: the watchdog timeout
        ("mark",),
        ("attempt", True, 3.0),
        ("wait", 1.5),
        ("wait_subscribed", 1.5),
        ("mark",),
        ("attempt", True, 1.5),
    ]
    assert made.registered is False


def test_a_sleep_is_never_longer_than_the_watchdog_timeout(now: FakeClock) -> None:
    # The waiting-set entry lives as long as the sleep it announces: a longer
    # sleep would outlive it, and a release would find nobody to wake.
    shell = Shell(now, [600.0, 600.0, None])
    assert drive(plan(wait=None, watchdog=3.0), shell) is True
    attempts = [step for step in shell.steps if step[0] == "attempt"]
    waits = [step for step in shell.steps if step[0] == "wait"]
    assert attempts[1:] == [("attempt", True, 3.0), ("attempt", True, 3.0)]
    assert waits == [("wait", 3.0)]


def test_every_wait_ends_at_the_callers_deadline(now: FakeClock) -> None:
    # Nobody releases: each wait runs its full length and the clock moves.
    shell = Shell(now, [5.0, 5.0, 5.0, 5.0], woken=False, elapse=10.0)
    made = plan(wait=1.2)
    assert drive(made, shell) is False
    assert shell.steps == [
        ("attempt", False, 0.0),
        ("listen",),
        ("wait_subscribed", 1.2),
        ("mark",),
        ("attempt", True, 1.2),
        ("wait", 1.2),
    ]
    assert now.now == pytest.approx(1.2)
    # It may still be in the waiting set: the shell must take it out.
    assert made.registered is True


def test_time_spent_before_a_retry_shortens_the_next_wait(now: FakeClock) -> None:
    shell = Shell(now, [5.0, 5.0, None], woken=True, elapse=0.7)
    assert drive(plan(wait=2.0), shell) is True
    waits = [step[-1] for step in shell.steps if step[0] in ("wait_subscribed", "wait")]
    assert waits == pytest.approx([2.0, 2.0, 1.3])  # 2.0 s less the 0.7 s spent waiting


def test_a_handoff_ends_the_plan_granted_without_another_attempt(now: FakeClock) -> None:
    shell = Shell(now, [5.0, 5.0], woken=HANDED)
    made = plan(wait=10)
    assert drive(made, shell) is True
    assert shell.steps[-1] == ("wait", 5.0)
    assert sum(step[0] == "attempt" for step in shell.steps) == 2
    assert made.registered is False  # the handoff took it out of the queue


def test_a_deadline_passed_during_the_subscription_gives_up_before_any_waiter_attempt(
    now: FakeClock,
) -> None:
    shell = Shell(now, [5.0])

    def slow_listen() -> None:
        shell.steps.append(("listen",))
        now.now += 3.0

    shell.listen = slow_listen  # type: ignore[method-assign]
    made = plan(wait=2.0)
    assert drive(made, shell) is False
    assert shell.steps == [("attempt", False, 0.0), ("listen",)]
    assert made.registered is False


class AsyncShell(Shell):
    """The same answers, some of them as coroutines (an asyncio shell's calls)."""

    async def attempt(self, waiter: bool, sleep: float) -> float | None:  # type: ignore[override]
        await asyncio.sleep(0)
        return Shell.attempt(self, waiter, sleep)

    async def wait(self, since: int, timeout: float) -> object:
        await asyncio.sleep(0)
        return Shell.wait(self, since, timeout)


def test_the_asyncio_driver_takes_the_same_steps(now: FakeClock) -> None:
    replies: list[float | None] = [2.0, 1.5, None]
    sync_shell, async_shell = Shell(now, replies), AsyncShell(now, replies)
    assert drive(plan(wait=10), sync_shell) is True
    assert asyncio.run(drive_async(plan(wait=10), async_shell)) is True
    assert async_shell.steps == sync_shell.steps
