"""What the demo checks, as pure functions over what it recorded."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime


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
