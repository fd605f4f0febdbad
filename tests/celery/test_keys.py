"""Task lock keys: signature-bound, defaults applied, clear errors, long keys hashed."""

from __future__ import annotations

import pytest

from tests.celery import app as test_app
from tests.celery.workers import Worker

pytestmark = pytest.mark.slow


def test_positional_and_keyword_calls_share_a_key(worker: Worker) -> None:
    names = {
        test_app.report.delay(1).get(timeout=20),
        test_app.report.delay(customer_id=1).get(timeout=20),
        test_app.report.delay(1, "pdf").get(timeout=20),
    }
    assert names == {"report:1:pdf"}
    assert test_app.charge.delay(5).get(timeout=20) == "order:5"
    assert test_app.charge.delay(order_id=5).get(timeout=20) == "order:5"


def test_very_long_keys_are_hashed_not_truncated(worker: Worker) -> None:
    head = "x" * 3000
    first = test_app.report.delay(f"{head}a").get(timeout=20)
    second = test_app.report.delay(f"{head}b").get(timeout=20)
    assert first != second
    assert len(first.encode()) <= 1024
    assert first.startswith("report:xxx")


def test_arguments_that_cannot_be_formatted_fail_the_run_clearly(worker: Worker) -> None:
    with pytest.raises(ValueError, match=r"cannot build lock key from 'item:\{payload\[id\]\}'"):
        test_app.keyed.delay({"name": "no id"}).get(timeout=20)
