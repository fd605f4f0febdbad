"""What every model test shares: the library's logging kept to errors."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    # Every fault and every lost hold makes the library log warnings; the
    # model's invariants tell the story.
    logger = logging.getLogger("django_rlock")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)
