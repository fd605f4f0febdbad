"""A semaphore's release waking a waiter: how long after the release the waiter held a permit."""

from __future__ import annotations

import threading
import time

from django_rlock.core import Semaphore


def seconds_to_wake(semaphore: Semaphore, *, settle: float, wait: float = 30) -> float:
    """Release the caller's permit of ``semaphore`` to a waiting thread; seconds until it held one.

    The waiter asks for a permit (waiting up to ``wait`` seconds), is given
    ``settle`` seconds to register and sleep, then the caller releases.
    """
    granted_at: list[float] = []

    def waiter() -> None:
        assert semaphore.acquire(timeout=wait)
        granted_at.append(time.monotonic())
        semaphore.release()

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(settle)
    released_at = time.monotonic()
    semaphore.release()
    thread.join(wait + 10)
    assert granted_at, "the waiter never held a permit"
    return granted_at[0] - released_at
