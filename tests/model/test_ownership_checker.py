"""The ownership check on histories written by hand: it fires where a scope's claim was broken.

No server: each test records scopes, claims, leak reports and refused
releases as the world would, at chosen moments in the past, and asks
:meth:`~tests.model.history.History.check_ownership` what it finds. Each
violation has a twin that is legitimate (the scope had ended, the lease had
run out, a fault came near), so what fires is the broken claim, not the shape
of the history.
"""

from __future__ import annotations

import pytest

from django_rlock.core._protocol import clock
from django_rlock.core._protocol.holds import Hold
from tests.model.history import (
    LOCK,
    OWNERSHIP,
    READ,
    THREAD_SCOPE,
    UNIT_SCOPE,
    Claim,
    History,
    LeakReport,
    OwnershipBroken,
    RefusedRelease,
    Scope,
)

#: How long a fault's effects may outlast it, as the world passes it.
MARGIN = 3.0


def ago(seconds: float) -> float:
    """A moment ``seconds`` before now on the library's clock."""
    return clock.monotonic() - seconds


def scope(owner: str, began: float, ended: float | None = None, kind: str = THREAD_SCOPE) -> Scope:
    return Scope(owner, kind, 0, began, ended)


def claim(
    owner_scope: Scope,
    granted_at: float,
    *,
    lease: float | None = None,
    kind: str = LOCK,
    hold: Hold | None = None,
) -> Claim:
    sent_at = granted_at - 0.01
    return Claim(
        scope=owner_scope,
        name="a",
        kind=kind,
        how="acquire",
        sent_at=sent_at,
        granted_at=granted_at,
        first_lease=lease,
        lease_end=None if lease is None else sent_at + lease,
        hold=hold or _hold(sent_at),
    )


def _hold(acquired_at: float) -> Hold:
    return Hold(
        name="a",
        key="model:{a}",
        fence="model:{a}:fence",
        owner="p:1",
        token=1,
        count=1,
        watchdog=True,
        deadline=acquired_at + 1,
        acquired_at=acquired_at,
    )


def found(history: History) -> list[str]:
    return [violation.detail for violation in history.check_ownership(MARGIN)]


def test_a_rival_granted_while_a_scope_claims_the_name() -> None:
    history = History()
    history.claims += [claim(scope("t0", ago(20)), ago(19)), claim(scope("t1", ago(20)), ago(18))]
    [detail] = found(history)
    assert "t1 thread #0 was granted 'a'" in detail
    with pytest.raises(OwnershipBroken):
        history.raise_first()


def test_a_rival_granted_after_the_scope_ended_or_the_owner_released() -> None:
    history = History()
    ended = claim(scope("t0", ago(20), ended=ago(18)), ago(19))
    released = claim(scope("t1", ago(20)), ago(17))
    released.released_at = ago(16)
    history.claims += [ended, released, claim(scope("t2", ago(20)), ago(15))]
    assert found(history) == []


def test_a_lease_claim_outlives_its_scope_until_its_lease_ends() -> None:
    history = History()
    unit = scope("w0", ago(20), ended=ago(18.5), kind=UNIT_SCOPE)
    history.claims += [
        claim(unit, ago(19), lease=2.0),  # claimed until about ago(17)
        # The next unit, on the same thread (ended before the rival came).
        claim(scope("w0", ago(18.4), ended=ago(17.5), kind=UNIT_SCOPE), ago(18)),
        claim(scope("t1", ago(20)), ago(16)),  # after the lease: fine
    ]
    [detail] = found(history)
    assert "unit of work" in detail
    assert "lease 2s" in detail


def test_one_scope_re_entering_and_readers_sharing_are_no_rivals() -> None:
    history = History()
    owner = scope("t0", ago(20))
    history.claims += [
        claim(owner, ago(19)),
        claim(owner, ago(18)),
        claim(scope("t1", ago(20)), ago(17), kind=READ),
        claim(scope("t2", ago(20)), ago(16), kind=READ),
    ]
    history.claims[0].released_at = history.claims[1].released_at = ago(17.5)
    assert found(history) == []


def test_a_leak_report_while_the_scope_claims_the_hold() -> None:
    history = History()
    open_claim = claim(scope("t0", ago(20)), ago(19))
    open_claim.released_at = ago(17)  # given back after the report, before the next grant
    ended_claim = claim(scope("t1", ago(20), ended=ago(15)), ago(16))
    history.claims += [open_claim, ended_claim]
    history.leak_reports += [
        LeakReport(ago(18), open_claim.hold, "the thread that took it ended"),  # type: ignore[arg-type]
        LeakReport(ago(14), ended_claim.hold, "the thread that took it ended"),  # type: ignore[arg-type]
    ]
    [detail] = found(history)
    assert "reported leaked" in detail
    assert "t0 thread" in detail


def test_a_refused_release_of_a_claimed_hold() -> None:
    history = History()
    watchdog = claim(scope("t0", ago(20)), ago(19))
    watchdog.released_at = started = ago(18)
    expired = claim(scope("t1", ago(20)), ago(17), lease=0.5)
    expired.released_at = too_late = ago(15)
    history.claims += [watchdog, expired]
    history.refused_releases += [
        RefusedRelease(watchdog, "LockNotOwnedError", started, started + 0.1),
        RefusedRelease(expired, "LockLostError", too_late, too_late + 0.1),  # its lease had ended
    ]
    [detail] = found(history)
    assert "LockNotOwnedError" in detail


def test_a_grant_recorded_for_another_owner_id() -> None:
    history = History()
    orphan = claim(scope("task-0", ago(20)), ago(19))
    orphan.hold = None
    other_process = claim(scope("process-0", ago(20)), ago(10))
    other_process.hold, other_process.in_process = None, False
    history.claims += [orphan, other_process]
    history.claims[0].released_at = ago(11)
    [detail] = found(history)
    assert "recorded no hold of the caller" in detail


def test_a_fault_near_excuses_what_it_may_have_caused() -> None:
    history = History()
    history.claims += [claim(scope("t0", ago(20)), ago(19)), claim(scope("t1", ago(20)), ago(18))]
    history.fault_windows.append((ago(19.5), ago(19.2)))
    assert found(history) == []
    # Long after its margin, a fault excuses nothing.
    far = History()
    far.claims += [claim(scope("t0", ago(20)), ago(19)), claim(scope("t1", ago(20)), ago(18))]
    far.fault_windows.append((ago(40), ago(39)))
    assert len(found(far)) == 1
    assert far.violations[0].invariant == OWNERSHIP
