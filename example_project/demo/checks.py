"""What the demo checks, as pure functions over what it recorded: the report's rows."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from demo.outcomes import (
    CaptureTotals,
    HttpTotals,
    Kill,
    Measured,
    Pause,
    Picture,
    Renewals,
    ReportTotals,
    Stopped,
)
from demo.plan import Plan

#: The labelled marks the timeline must show: the kill scenario's and the pause scenario's.
TIMELINE_MARKS = ("expired", "freed", "lost", "paused", "refused", "sigkill")

#: Slack allowed between a lock's expiry and the demo seeing it free (seconds).
EXPIRY_SLACK = 0.5


@dataclass(frozen=True)
class Check:
    """One line of the report: what was measured, and whether it is as it must be."""

    label: str
    detail: str
    ok: bool


@dataclass(frozen=True)
class Section:
    """One critical section recorded under a lock: its fencing token and when it ran.

    ``before`` / ``after`` are the protected value (an order's balance) as the
    section found and left it; None where there is none (a report).
    """

    fence: int
    start: datetime
    end: datetime
    before: int | None = None
    after: int | None = None


def violations(sections: Iterable[Section], initial: int | None = None) -> list[str]:
    """Every sign that two sections under one lock overlapped.

    Sorted by fencing token, the grants of one lock must each start after the
    previous one ended, never share a token, and each must find the value the
    previous one left (``initial`` for the first): an overlap of two holders
    shows as a shared token, overlapping times, or a lost update.
    """
    ordered = sorted(sections, key=lambda section: section.fence)
    found = []
    if ordered and initial is not None and ordered[0].before != initial:
        found.append(f"first section found {ordered[0].before}, not {initial}")
    for earlier, later in itertools.pairwise(ordered):
        if later.fence == earlier.fence:
            found.append(f"token {later.fence} granted twice")
        elif later.start < earlier.end:
            found.append(f"token {later.fence} started before token {earlier.fence} ended")
        elif later.before is not None and later.before != earlier.after:
            found.append(
                f"token {later.fence} found {later.before}, token {earlier.fence} left "
                f"{earlier.after} (a lost update)"
            )
    return found


def balance_errors(total: int, balance: int, payments: int, refunds: int) -> list[str]:
    """Why an order's balance disagrees with its ledger (empty when it agrees)."""
    expected = total - payments + refunds
    errors = []
    if balance != expected:
        errors.append(f"balance {balance} != total {total} - paid {payments} + refunded {refunds}")
    if not 0 <= balance <= total:
        errors.append(f"balance {balance} outside [0, {total}]")
    return errors


def render(checks: Sequence[Check]) -> str:
    """The checks as an aligned text table."""
    label_width = max(len("check"), *(len(check.label) for check in checks))
    detail_width = max(len("measured"), *(len(check.detail) for check in checks))
    rule = f"+-{'-' * label_width}-+-{'-' * detail_width}-+------+"
    lines = [rule, f"| {'check':<{label_width}} | {'measured':<{detail_width}} |      |", rule]
    for check in checks:
        mark = " ok " if check.ok else "FAIL"
        lines.append(f"| {check.label:<{label_width}} | {check.detail:<{detail_width}} | {mark} |")
    lines.append(rule)
    return "\n".join(lines)


def report_checks(plan: Plan, measured: Measured, stopped: Stopped) -> list[Check]:
    """The rows of the report, in order, from what a complete run measured."""
    http, tasks, renewals = measured.load.http, measured.tasks, measured.renewals
    ledger = measured.ledger
    return [
        http_check(http),
        conflicts_check(http),
        captures_check(tasks.captures),
        reports_check(tasks.reports),
        renewals_check(renewals, plan),
        kill_check(measured.load.kill, tasks.reports, plan),
        pause_check(measured.load.pause),
        Check(
            "mutual-exclusion violations",
            str(len(ledger.violations))
            + (f": {ledger.violations[0]}" if ledger.violations else ""),
            not ledger.violations and ledger.orders > 0,
        ),
        Check(
            "order balances consistent",
            f"{ledger.orders - len(ledger.inconsistent_orders)} of {ledger.orders}",
            ledger.orders > 0 and not ledger.inconsistent_orders,
        ),
        timeline_check(measured.picture),
        Check(
            "processes left running",
            str(len(stopped.left_running))
            + (f": {', '.join(stopped.left_running)}" if stopped.left_running else ""),
            not stopped.left_running,
        ),
    ]


def http_check(http: HttpTotals) -> Check:
    return Check(
        "HTTP requests answered",
        f"{http.served:,} ({http.by_status.get('200', 0):,} x 200), {http.errors} errors",
        http.served > 0 and http.errors == 0,
    )


def conflicts_check(http: HttpTotals) -> Check:
    conflicts = http.by_status.get("409", 0)
    return Check(
        "409 Conflict answers (refund busy)",
        f"{conflicts:,}, {http.conflicts_without_retry_after} without Retry-After",
        conflicts > 0 and http.conflicts_without_retry_after == 0,
    )


def captures_check(captures: CaptureTotals) -> Check:
    return Check(
        "capture tasks run / retried",
        f"{captures.succeeded} of {captures.sent} run, "
        f"{captures.retried_tasks} retried ({captures.retries} retries), "
        f"{captures.failed} failed",
        captures.sent > 0 and captures.succeeded == captures.sent and captures.retries > 0,
    )


def reports_check(reports: ReportTotals) -> Check:
    return Check(
        "report tasks run / retried",
        f"{reports.succeeded} of {reports.queued} done in {reports.runs} runs, "
        f"{reports.retries} retries, {reports.lost} lost their lock",
        reports.queued > 0 and reports.succeeded == reports.queued and reports.lost == 0,
    )


def renewals_check(renewals: Renewals, plan: Plan) -> Check:
    longest = renewals.longest_hold
    return Check(
        "lock renewals (report locks)",
        f"{renewals.renewals} seen; longest hold {longest:.1f}s = "
        f"{longest / plan.watchdog:.1f}x the {plan.watchdog:g}s timeout"
        + ("" if renewals.lowest_ttl is None else f", lowest TTL {renewals.lowest_ttl:.2f}s"),
        renewals.renewals > 0 and longest >= 3 * plan.watchdog,
    )


def kill_check(kill: Kill, reports: ReportTotals, plan: Plan) -> Check:
    freed = kill.freed_after
    if freed is None:
        return Check("killed task's lock freed after", kill.error or "never", False)
    rerun = "finished" if reports.killed_run_finished else "NOT finished"
    return Check(
        "killed task's lock freed after",
        f"{freed:.2f}s (timeout {plan.watchdog:g}s); rerun {rerun}",
        freed <= plan.watchdog + EXPIRY_SLACK and reports.killed_run_finished,
    )


def pause_check(pause: Pause) -> Check:
    detail = (
        f"token {pause.token} refused after token {pause.overtaken_by}; "
        f"release raised {pause.release_raised or 'nothing'}"
    )
    return Check(
        "paused holder's stale write",
        pause.error or detail,
        pause.refused and pause.release_raised == "LockLostError",
    )


def timeline_check(picture: Picture) -> Check:
    missing = [kind for kind in TIMELINE_MARKS if kind not in picture.marked]
    if picture.error:
        detail = picture.error
    else:
        detail = f"{picture.svg} (+ .html): {picture.holds} holds, {picture.renewals} renewals"
        detail += f", no {', '.join(missing)}" if missing else ""
    return Check(
        "timeline picture",
        detail,
        not picture.error and not missing and picture.renewals > 0,
    )
