"""How long locks are really held, recently: the honest ``Retry-After``.

A busy view answers 409 with a ``Retry-After``, and a busy Celery task retries
after a countdown. The holder's remaining lease is only an upper bound (a
watchdog lease is 30 s however short the holds are), so both ask
:meth:`HoldTimes.retry_after`: the median of the holds this process saw end
recently for the same lock name, or else for the same key template
(``order:{order_id}``), bounded by the lease left and at least one second.

Only this process's holds are seen (each process learns from its own); memory
is bounded: the last :data:`SAMPLES` holds per name for the
:data:`NAMES` most recently seen names, and per template.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections import OrderedDict, deque

from django_rlock.core import forking

__all__ = ["MIN_RETRY_AFTER", "NAMES", "SAMPLES", "HoldTimes"]

#: Holds kept per lock name and per key template.
SAMPLES = 16
#: Lock names whose holds are kept (the least recently seen are forgotten).
NAMES = 1024
#: Fewer holds than this say nothing yet: the lease left is used instead.
MIN_SAMPLES = 3
#: The shortest back-off asked of a client, in seconds (Retry-After counts whole seconds).
MIN_RETRY_AFTER = 1.0


class HoldTimes:
    """Recent hold durations of one backend's locks, per name and per key template."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        forking.renew_after_fork(self, "_mutex")
        self._by_name: OrderedDict[str, deque[float]] = OrderedDict()
        self._by_template: dict[str, deque[float]] = {}

    def observe(self, name: str, template: str | None, held: float) -> None:
        """Record a hold of ``name`` (built from ``template``, if any) that lasted ``held`` s."""
        with self._mutex:
            samples = self._by_name.pop(name, None) or deque(maxlen=SAMPLES)
            samples.append(held)
            self._by_name[name] = samples
            if len(self._by_name) > NAMES:
                self._by_name.popitem(last=False)
            if template is not None:
                self._by_template.setdefault(template, deque(maxlen=SAMPLES)).append(held)

    def typical(self, name: str, template: str | None) -> float | None:
        """The median recent hold of ``name``, else of ``template``; None with too few."""
        with self._mutex:
            for samples in (self._by_name.get(name), self._by_template.get(template or "")):
                if samples is not None and len(samples) >= MIN_SAMPLES:
                    return statistics.median(samples)
        return None

    def retry_after(self, name: str, template: str | None, lease_left: float | None) -> float:
        """Seconds a caller turned away from ``name`` should wait before trying again.

        The typical recent hold, bounded by ``lease_left`` (the holder's TTL:
        the lock is free by then at the latest), and at least
        :data:`MIN_RETRY_AFTER`. With no recent holds, the lease left.
        """
        bound = lease_left if lease_left is not None and math.isfinite(lease_left) else None
        typical = self.typical(name, template)
        if typical is None:
            seconds = bound if bound is not None else MIN_RETRY_AFTER
        else:
            seconds = typical if bound is None else min(typical, bound)
        return max(MIN_RETRY_AFTER, seconds)
