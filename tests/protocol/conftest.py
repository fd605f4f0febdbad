"""The protocol's tests (django_rlock/core/_protocol): pure, no server, no socket.

Every module here is marked ``pure`` (``make test-fast`` runs them with no
server allowed). Names and owners are fresh per test: the hold registry
records lost holds in a process-wide table (core/_process/lostholds.py).
"""

from __future__ import annotations

import uuid

import pytest


@pytest.fixture
def owner() -> str:
    """A fresh owner id, in the shape the engines make (process id : thread)."""
    return f"{uuid.uuid4().hex}:{uuid.uuid4().int % 10_000}"
