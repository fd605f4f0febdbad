"""The one seam through which the engine reads time.

Deadlines are local and monotonic: wall-clock jumps must never make a lock look
alive or dead. Tests that need to drive time replace :data:`monotonic`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["monotonic"]

monotonic: Callable[[], float] = time.monotonic
