"""How long locks are really held: the honest ``Retry-After``, from the first request.

A busy view answers 409 with a ``Retry-After``, and a busy Celery task retries
after a countdown. The holder's remaining lease is only an upper bound (a
watchdog lease is 30 s however short the holds are), so both follow one rule,
:meth:`HoldTimes.retry_after`:

1. the median of the holds this process saw end recently for the same lock
   name, or else for the same key template (``order:{order_id}``);
2. with no such history (fewer than :data:`MIN_SAMPLES` holds), how long the
   current holder has held the lock so far (its ``acquired_at``, stored with
   the lock): a lock held 0.2 s is likely free soon, one held ten minutes is not;
3. when that cannot be read either, the lease left;

always bounded by the lease left (the lock is free by then at the latest) and
at least :data:`MIN_RETRY_AFTER` second.

:mod:`django_rlock._observers.retryafter` applies the rule to a backend's lock name and
to a lock object (the middleware, Celery's countdown).

Only this process's holds are seen (each process learns from its own); memory
is bounded: the last :data:`SAMPLES` holds per name for the
:data:`NAMES` most recently seen names, and per template.
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
from collections import OrderedDict, deque
from typing import TYPE_CHECKING

from django_rlock.core._faces import forking

if TYPE_CHECKING:
    pass

logger = logging.getLogger("django_rlock.lock")

#: Holds kept per lock name and per key template.
SAMPLES = 16
#: Lock names whose holds are kept (the least recently seen are forgotten).
NAMES = 1024
#: Fewer holds than this say nothing yet: the current holder's time so far is used instead.
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
            by_name = self._by_name
            samples = by_name.get(name)
            if samples is None:
                samples = by_name[name] = deque(maxlen=SAMPLES)
                if len(by_name) > NAMES:
                    by_name.popitem(last=False)
            else:
                by_name.move_to_end(name)  # the most recently seen last
            samples.append(held)
            if template is not None:
                self._by_template.setdefault(template, deque(maxlen=SAMPLES)).append(held)

    def typical(self, name: str, template: str | None) -> float | None:
        """The median recent hold of ``name``, else of ``template``; None with too few."""
        with self._mutex:
            for samples in (self._by_name.get(name), self._by_template.get(template or "")):
                if samples is not None and len(samples) >= MIN_SAMPLES:
                    return statistics.median(samples)
        return None

    def retry_after(
        self,
        name: str,
        template: str | None,
        lease_left: float | None,
        held_for: float | None = None,
    ) -> float:
        """Seconds a caller turned away from ``name`` should wait before trying again.

        The rule of this module, in one place: the typical recent hold, else
        ``held_for`` (how long the current holder has held the lock so far;
        0 when it was found free), else ``lease_left``; bounded by
        ``lease_left`` (the holder's TTL: the lock is free by then at the
        latest) and at least :data:`MIN_RETRY_AFTER`.
        """
        return back_off(self.typical(name, template), held_for, lease_left)


def back_off(typical: float | None, held_for: float | None, lease_left: float | None) -> float:
    """The rule: ``typical`` (a recent hold), else ``held_for``, else ``lease_left``; bounded.

    See :meth:`HoldTimes.retry_after`; also used alone for a lock of no alias,
    which has no hold history (``typical`` None).
    """
    bound = lease_left if lease_left is not None and math.isfinite(lease_left) else None
    estimate = typical
    if estimate is None and held_for is not None and math.isfinite(held_for):
        # Held t so far: as likely to end within about t more as not
        # (a 0.2 s hold does not make a client wait out a 30 s lease).
        estimate = max(0.0, held_for)
    if estimate is None:
        seconds = bound if bound is not None else MIN_RETRY_AFTER
    else:
        seconds = estimate if bound is None else min(estimate, bound)
    return max(MIN_RETRY_AFTER, seconds)
