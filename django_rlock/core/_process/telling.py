"""Telling a holder its hold was lost: the callbacks run on a thread of their own.

The hold registry (``_protocol/holds.py``) decides who is told; this runs
the callbacks, away from the caller (the watchdog's thread, a release, an
acquire): a callback may block, or call back into the engine, without
holding up renewals or deadlocking on the registry.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("django_rlock.lock")

#: Each callback with what it is told about (a lock, or the lost hold).
Calls = list[tuple[Callable[[Any], object], object]]


def tell(calls: Calls) -> None:
    """Run each callback with its subject on a new daemon thread; log what fails."""
    if calls:
        threading.Thread(target=_run, args=(calls,), name="rlock-on-lost", daemon=True).start()


def _run(calls: Calls) -> None:
    for callback, subject in calls:
        try:
            callback(subject)
        except Exception:
            logger.exception("on_lost callback %r failed", callback)
