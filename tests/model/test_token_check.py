"""The token check tells a new grant from an owner re-entering its own grant.

Every fresh grant draws a new fencing token, so one owner's beliefs with one
token are one grant on the server. The check excuses a repeat only while one
of them lived when the later call was sent; an owner told that its hold is
gone must get a new token. Found by the lock model soak: an owner re-entered
its fixed-lease grant through a second client and then a third (each earlier
client closed under it), and the third client's hold was compared with the
first client's belief alone, which had ended before; the second client's,
alive at the time, was left out.
"""

from __future__ import annotations

import time

import pytest

from django_rlock.core._protocol import clock
from django_rlock.core._protocol.holds import Hold
from tests.model.history import Belief, History
from tests.model.test_world import ONE_THREAD
from tests.model.world import Acquire, World

pytestmark = [pytest.mark.faults, pytest.mark.slow]

TOKEN = 1_000


def belief(
    owner: str,
    sent: float,
    deadline: float,
    *,
    token: int = TOKEN,
    lost_at: float | None = None,
) -> Belief:
    """A belief in a grant of ``'a'`` sent at ``sent`` (seconds ago +100), granted 10 ms later."""
    base = clock.monotonic() - 100
    hold = Hold(
        name="a",
        key="model:{a}",
        fence="model:{a}:fence",
        owner=owner,
        token=token,
        count=1,
        watchdog=False,
        deadline=base + deadline,
        acquired_at=base + sent,
        lost=lost_at is not None,
    )
    return Belief(
        owner=owner,
        name="a",
        token=token,
        hold=hold,
        sent_at=base + sent,
        granted_at=base + sent + 0.01,
        lost_at=None if lost_at is None else base + lost_at,
    )


def violations(*beliefs: Belief) -> list[str]:
    history = History()
    history.beliefs.extend(beliefs)
    return [violation.detail for violation in history.check_tokens()]


@pytest.mark.pure
def test_a_grant_re_entered_through_three_clients_is_one_grant() -> None:
    first = belief("x", sent=0.0, deadline=2.0)
    second = belief("x", sent=0.3, deadline=2.3)  # its first client closed
    third = belief("x", sent=2.1, deadline=2.4)  # the second one closed too
    assert violations(first, second, third) == []


@pytest.mark.pure
def test_without_a_belief_alive_between_the_repeat_is_a_violation() -> None:
    first = belief("x", sent=0.0, deadline=2.0)
    third = belief("x", sent=2.1, deadline=2.4)
    [detail] = violations(first, third)
    assert detail.startswith("'a': [x token 1000 (lease): sent")


@pytest.mark.pure
def test_a_re_entry_sent_before_its_hold_was_declared_lost_is_no_grant() -> None:
    # Declared lost 5 ms after the re-entry was sent, 5 ms before its reply came.
    held = belief("x", sent=0.0, deadline=5.0, lost_at=1.005)
    assert violations(held, belief("x", sent=1.0, deadline=1.9)) == []


@pytest.mark.pure
def test_an_owner_told_its_hold_is_lost_must_get_a_new_token() -> None:
    held = belief("x", sent=0.0, deadline=5.0, lost_at=1.005)
    assert len(violations(held, belief("x", sent=1.006, deadline=1.9))) == 1


@pytest.mark.pure
def test_another_owner_is_never_excused_a_repeated_token() -> None:
    held = belief("x", sent=0.0, deadline=5.0)
    assert len(violations(held, belief("y", sent=1.0, deadline=1.9))) == 1


@pytest.mark.pure
def test_a_higher_token_after_a_re_entered_grant_is_no_violation() -> None:
    first = belief("x", sent=0.0, deadline=2.0)
    second = belief("x", sent=0.3, deadline=2.3)
    other = belief("y", sent=2.5, deadline=3.0, token=TOKEN + 1)
    assert violations(first, second, other) == []


def test_the_real_lock_re_entered_through_three_clients_passes_the_token_check() -> None:
    with World(ONE_THREAD) as world:
        # A 2 s lease; its client is closed (a lease runs on); the owner asks
        # again through the new client at 0.3 s, and the server re-enters it,
        # now to 2.3 s; that client is closed too; past 2 s the owner asks a
        # third time: the first belief has ended, the second lives.
        world.submit(0, Acquire("a", lease=2.0, wait=None)).result(30)
        started = clock.monotonic()
        world.close_client(0)
        time.sleep(max(0.0, started + 0.3 - clock.monotonic()))
        world.submit(0, Acquire("a", lease=2.0, wait=None)).result(30)
        world.close_client(0)
        time.sleep(max(0.0, started + 2.05 - clock.monotonic()))
        world.submit(0, Acquire("a", lease=0.3, wait=None)).result(30)
        first, second, third = world.history.beliefs
        assert first.token == second.token == third.token
        assert first.hold.deadline < third.sent_at < second.hold.deadline
        world.check()
