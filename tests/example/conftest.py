"""Running the example project (example_project/) from the repository's test suite.

The shop is a Django project with settings of its own, so it never runs inside
this pytest process (configured with tests.django_settings): its own test suite
and its demo run as subprocesses, as a user would run them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import django
import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """On Django < 5.1 the example's tests skip, saying why.

    The library supports Django 4.2; the shop's settings ask SQLite for BEGIN
    IMMEDIATE and WAL (OPTIONS transaction_mode, init_command, Django 5.1+),
    without which its web threads and workers would fail on "database is
    locked" instead of waiting.
    """
    if django.VERSION >= (5, 1):
        return
    needs = pytest.mark.skip(reason="the example shop needs Django 5.1+ (SQLite transaction_mode)")
    for item in items:
        if Path(item.path).is_relative_to(Path(__file__).parent):
            item.add_marker(needs)


PROJECT_DIR = Path(__file__).resolve().parents[2] / "example_project"


def project_env(**extra: str) -> dict[str, str]:
    """This environment without the test suite's Django settings, plus ``extra``."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DJANGO_SETTINGS_MODULE", "REDIS_URL")
    }
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


PYTHON = sys.executable
