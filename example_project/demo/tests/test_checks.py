"""The demo's checks catch what they claim to catch."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

from demo.checks import (
    TIMELINE_MARKS,
    Check,
    Section,
    balance_errors,
    render,
    report_checks,
    violations,
)
from demo.outcomes import (
    CaptureTotals,
    HttpTotals,
    Kill,
    Ledger,
    Load,
    Measured,
    Pause,
    Picture,
    Renewals,
    ReportTotals,
    Shop,
    Stopped,
    Tasks,
)
from demo.plan import QUICK
from demo.timeline import Recorded

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_sections_one_after_another_are_no_violation() -> None:
    sections = [Section(2, at(1), at(2), 90, 80), Section(1, at(0), at(1), 100, 90)]
    assert violations(sections, initial=100) == []


def test_overlapping_times_are_a_violation() -> None:
    sections = [Section(1, at(0), at(2), 100, 90), Section(2, at(1), at(3), 90, 80)]
    assert violations(sections, initial=100) == ["token 2 started before token 1 ended"]


def test_a_token_granted_twice_is_a_violation() -> None:
    sections = [Section(1, at(0), at(1)), Section(1, at(2), at(3))]
    assert violations(sections) == ["token 1 granted twice"]


def test_a_lost_update_is_a_violation_even_when_times_look_fine() -> None:
    sections = [Section(1, at(0), at(1), 100, 90), Section(2, at(1), at(2), 100, 80)]
    assert violations(sections, initial=100) == [
        "token 2 found 100, token 1 left 90 (a lost update)"
    ]


def test_a_first_section_that_did_not_start_from_the_initial_value_is_a_violation() -> None:
    assert violations([Section(1, at(0), at(1), 50, 40)], initial=100) == [
        "first section found 50, not 100"
    ]


def test_balance_errors() -> None:
    assert balance_errors(total=100, balance=70, payments=40, refunds=10) == []
    assert balance_errors(total=100, balance=60, payments=40, refunds=10) == [
        "balance 60 != total 100 - paid 40 + refunded 10"
    ]


def test_render_marks_failures() -> None:
    table = render([Check("a", "1", True), Check("bb", "2", False)])
    assert "| a     | 1        |  ok  |" in table
    assert "| bb    | 2        | FAIL |" in table


#: A run as it must go: every row of the report green.
GOOD = Measured(
    shop=Shop(port=8000, customers=(1, 2, 3), orders=(1, 2), worker_pid=10),
    load=Load(
        http=HttpTotals(100, {"200": 90, "409": 10}, 0, 0, ()),
        capture_ids=("c1",),
        report_tasks=((1, "r1"),),
        kill=Kill(2, "r2", pid=11, token=1, held_before_kill=1.0, freed_after=1.2, killed_at=5.0),
        pause=Pause(1, token=4, lease=1.5, refused=True, release_raised="LockLostError"),
    ),
    tasks=Tasks(
        captures=CaptureTotals(10, 10, 0, 0, retries=3, retried_tasks=2, failures=()),
        reports=ReportTotals(4, 4, 0, 2, 0, runs=5, killed_run_finished=True, failures=()),
    ),
    renewals=Renewals(renewals=20, longest_hold=6.0, lowest_ttl=1.0),
    ledger=Ledger(orders=12, violations=(), inconsistent_orders=()),
    timeline=Recorded(started_wall=0.0, duration=20.0, grants=()),
    picture=Picture("/d/demo-timeline.svg", "/d/demo-timeline.html", 7, 20, TIMELINE_MARKS),
)


NOTHING_LEFT = Stopped(left_running=())


def failed_rows(measured: Measured, stopped: Stopped = NOTHING_LEFT) -> list[str]:
    return [check.label for check in report_checks(QUICK, measured, stopped) if not check.ok]


def test_a_good_run_passes_every_row_of_the_report() -> None:
    rows = report_checks(QUICK, GOOD, NOTHING_LEFT)
    assert len(rows) == 11 and all(check.ok for check in rows)
    assert rows[5].detail == "1.20s (timeout 1.5s); rerun finished"


def test_a_lock_freed_later_than_the_timeout_plus_slack_fails_its_row() -> None:
    kill = dataclasses.replace(GOOD.load.kill, freed_after=QUICK.watchdog + 0.6)
    late = dataclasses.replace(GOOD, load=dataclasses.replace(GOOD.load, kill=kill))
    assert failed_rows(late) == ["killed task's lock freed after"]


def test_an_accepted_stale_write_and_a_process_left_running_fail_their_rows() -> None:
    pause = dataclasses.replace(GOOD.load.pause, refused=False)
    accepted = dataclasses.replace(GOOD, load=dataclasses.replace(GOOD.load, pause=pause))
    assert failed_rows(accepted, Stopped(("celery worker",))) == [
        "paused holder's stale write",
        "processes left running",
    ]


def test_a_timeline_without_the_refused_write_or_not_drawn_fails_its_row() -> None:
    unrefused = dataclasses.replace(
        GOOD.picture, marked=tuple(k for k in TIMELINE_MARKS if k != "refused")
    )
    rows = report_checks(QUICK, dataclasses.replace(GOOD, picture=unrefused), NOTHING_LEFT)
    assert [row.detail for row in rows if not row.ok] == [
        "/d/demo-timeline.svg (+ .html): 7 holds, 20 renewals, no refused"
    ]
    undrawn = dataclasses.replace(GOOD, picture=Picture(error="ModuleNotFoundError: matplotlib"))
    assert failed_rows(undrawn) == ["timeline picture"]
