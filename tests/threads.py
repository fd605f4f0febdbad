"""Threads a test starts and waits for, with a bound that catches a hang."""

from __future__ import annotations

import threading
from collections.abc import Sequence


def run_to_end(threads: Sequence[threading.Thread], hang: float, hung_means: str = "") -> None:
    """Start ``threads``, then join each; one still running ``hang`` s after its join began hung.

    ``hang`` is generous (a loaded machine is slow, never stuck): reaching it
    fails the test, with ``hung_means`` (what a hang says) and the threads' names,
    instead of leaving it waiting forever.
    """
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(hang)
    hung = [thread.name for thread in threads if thread.is_alive()]
    assert hung == [], f"{hung_means or 'hung'}: still running after {hang} s each: {hung}"
