"""The one seam through which the engine reads time.

Deadlines are local and monotonic: wall-clock jumps must never make a lock look
alive or dead. Tests that need to drive time replace :data:`monotonic`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

monotonic: Callable[[], float] = time.monotonic


def drift(seconds: float) -> float:
    """How much of a span Redis measures (a key's TTL) this process does not count on.

    Redlock's drift term, 1% of the span plus 2 ms: Redis expires keys by its
    own clock (the wall clock, in milliseconds), which may run a little faster
    than this process's monotonic clock, or be corrected forward, and rounds to
    the millisecond. Every local deadline derived from a TTL ends this much
    sooner, so the holder stops believing before the key can expire.
    """
    return 0.01 * seconds + 0.002
