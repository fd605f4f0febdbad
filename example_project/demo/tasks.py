"""After the load: every capture and report task waited for, and how each ended."""

from __future__ import annotations

from celery.result import AsyncResult

from demo.console import Console
from demo.load import wait_results
from demo.outcomes import CaptureTotals, Load, ReportTotals, Tasks
from demo.plan import Plan
from orders.models import Report
from shop.celery import app


def wait_for_tasks(load: Load, plan: Plan, console: Console) -> Tasks:
    """Wait for the tasks the load sent (reports in flight still run), then count outcomes."""
    captures = wait_for_captures(load.capture_ids, plan)
    reports = wait_for_reports(load, plan)
    console.say(
        f"tasks done: {captures.succeeded} captures ({captures.retries} retries), "
        f"{reports.succeeded} reports"
    )
    return Tasks(captures=captures, reports=reports)


def wait_for_captures(task_ids: tuple[str, ...], plan: Plan) -> CaptureTotals:
    results = [AsyncResult(task_id, app=app) for task_id in task_ids]
    values, unfinished = wait_results(results, timeout=plan.watchdog * 30)
    captured = [value for value in values if isinstance(value, dict)]
    failed = [repr(value) for value in values if not isinstance(value, dict)]
    return CaptureTotals(
        sent=len(task_ids),
        succeeded=len(captured),
        failed=len(failed),
        unfinished=unfinished,
        retries=sum(value["attempts"] - 1 for value in captured),
        retried_tasks=sum(1 for value in captured if value["attempts"] > 1),
        failures=tuple(failed[:5]),
    )


def wait_for_reports(load: Load, plan: Plan) -> ReportTotals:
    results = [AsyncResult(task_id, app=app) for _, task_id in load.report_tasks]
    values, unfinished = wait_results(results, timeout=plan.report_seconds * 4 + 30)
    done = [value for value in values if isinstance(value, dict)]
    rows = list(Report.objects.order_by("pk"))
    return ReportTotals(
        queued=len(results),
        succeeded=len(done),
        unfinished=unfinished,
        retries=sum(value["attempts"] - 1 for value in done),
        lost=sum(1 for value in done if value["lost"]),
        runs=len(rows),
        killed_run_finished=any(
            row.task_id == load.kill.task_id and row.finished_at is not None for row in rows
        ),
        failures=tuple(repr(value) for value in values if not isinstance(value, dict))[:5],
    )
