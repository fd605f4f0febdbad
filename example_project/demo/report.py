"""The ``--json`` report: the plan, every phase's outcome, the checks, the verdict."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from types import MappingProxyType
from typing import Any

from demo.checks import Check
from demo.outcomes import Measured, Stopped
from demo.plan import Plan

#: The measures of a run that did not complete (it failed, or was interrupted).
NOT_MEASURED: Mapping[str, Any] = MappingProxyType(
    {
        "http": {},
        "tasks": {},
        "reports": {},
        "renewals": 0,
        "longest_hold": 0.0,
        "lowest_ttl": None,
        "kill": {},
        "pause": {},
        "violations": [],
        "orders": 0,
        "inconsistent_orders": [],
        "picture": {},
        "timeline": {},
    }
)


def json_report(
    *,
    plan: Plan,
    redis: str,
    elapsed: float,
    measured: Measured | None,
    stopped: Stopped,
    checks: list[Check],
    error: str,
) -> dict[str, Any]:
    """Everything measured, as JSON-ready data (a run that did not complete has no measures)."""
    report: dict[str, Any] = {"plan": asdict(plan), "redis": redis, "elapsed": elapsed}
    report.update(measures(measured) if measured is not None else NOT_MEASURED)
    report.update(
        left_running=list(stopped.left_running),
        checks=[asdict(check) for check in checks],
        error=error,
        ok=is_ok(checks),
    )
    return report


def measures(measured: Measured) -> dict[str, Any]:
    load, ledger = measured.load, measured.ledger
    return {
        "http": asdict(load.http),
        "tasks": asdict(measured.tasks.captures),
        "reports": asdict(measured.tasks.reports),
        **asdict(measured.renewals),  # renewals, longest_hold, lowest_ttl
        "kill": asdict(load.kill),
        "pause": asdict(load.pause),
        "violations": list(ledger.violations),
        "orders": ledger.orders,
        "inconsistent_orders": list(ledger.inconsistent_orders),
        "picture": asdict(measured.picture),
        "timeline": asdict(measured.timeline),  # every hold and mark drawn
    }


def is_ok(checks: list[Check]) -> bool:
    """The verdict: there are checks (the run completed) and every one passed."""
    return bool(checks) and all(check.ok for check in checks)
