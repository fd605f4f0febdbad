"""Running the example project (example_project/) from the repository's test suite.

The shop is a Django project with settings of its own, so it never runs inside
this pytest process (configured with tests.django_settings): its own test suite
and its demo run as subprocesses, as a user would run them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

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
