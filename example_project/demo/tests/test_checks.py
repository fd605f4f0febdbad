"""The demo's checks catch what they claim to catch."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from demo.checks import Check, Section, balance_errors, render, violations

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
