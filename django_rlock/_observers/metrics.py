"""Prometheus metrics of the locks, with ``RLOCK_METRICS = "prometheus"``.

Install the extra (``pip install 'django-rlock[prometheus]'``, which brings
prometheus_client) and set ``RLOCK_METRICS = "prometheus"``. The metrics are
registered on prometheus_client's default registry (``REGISTRY``): expose it
as the project already does (``prometheus_client.make_wsgi_app()``,
django-prometheus's ``/metrics`` view, ``start_http_server``...).

==========================================  =========  ==============================
``django_rlock_acquisitions_total``         counter    ``alias``, ``lock``, ``outcome``
``django_rlock_wait_seconds``               histogram  ``alias``, ``lock``
``django_rlock_hold_seconds``               histogram  ``alias``, ``lock``
``django_rlock_lost_total``                 counter    ``alias``, ``lock``
``django_rlock_leaked_total``               counter    ``alias``, ``lock``
``django_rlock_duplicates_total``           counter    ``alias``, ``lock``, ``found``
``django_rlock_deadlocks_total``            counter    ``alias``, ``lock``
``django_rlock_renewals_total``             counter    ``outcome``
``django_rlock_held``                       gauge      ``alias``, ``lock``
``django_rlock_throttled_total``            counter    ``alias``, ``limiter``, ``outcome``
==========================================  =========  ==============================

* ``outcome`` of an acquire call: ``acquired``; ``timeout`` (its wait ran
  out); ``busy`` (it made one attempt only, ``blocking=False`` or a zero
  timeout, and the lock was held); ``deadlock`` (it gave up to break a
  deadlock: DeadlockError). A re-entry is not an acquisition.
* ``django_rlock_wait_seconds``: how long each acquire call waited, whether it
  got the lock or not; ``django_rlock_hold_seconds``: how long each hold
  lasted, from its grant to its owner's last release (a lost hold too).
* ``outcome`` of a watchdog renewal, per lock: ``ok``, ``failed`` (the call
  failed; retried on the next tick), ``lost`` (the key was gone or another
  owner's).
* ``django_rlock_deadlocks_total``: deadlocks broken by giving up an
  acquire call of the alias (its caller got DeadlockError: docs/deadlocks.md);
  ``lock`` is the template of the lock that call waited for. One per cycle
  broken (only its victim counts), also counted as the ``deadlock`` outcome
  of ``django_rlock_acquisitions_total``.
* ``django_rlock_duplicates_total``: deliveries of a locked Celery task's
  message dropped as duplicates (:mod:`celery_rlock._delivery`); ``found`` is
  what gave them away: ``running`` (a live run of the same task id held the
  lock) or ``finished`` (one had ended).
* ``django_rlock_held``: the holds this process has now (one per owner and
  lock, however often re-entered).
* ``django_rlock_throttled_total``: calls a rate limiter of the alias held
  back; ``outcome`` ``refused`` (nothing taken: a view answered 429, a
  ``try_acquire`` said False, an ``acquire`` gave up) or ``delayed`` (the
  permits were reserved for later: an ``acquire`` slept, a Celery task was
  re-queued until its permit is due). ``limiter`` is the key template, as
  ``lock`` is for locks. Calls let through at once are not counted.
* ``lock`` is the key template the name was built from (``order:{order_id}``
  for ``@locked("order:{order_id}")`` and Celery's ``lock="order:{order_id}"``;
  ``module.qualname`` for a callable template), never the name itself: one
  series per order would grow without bound. A lock named directly
  (``rlock("order:42")``, ``locks["default"].lock(...)``) is counted under
  :data:`NO_TEMPLATE`, ``"-"``.

The counting hangs on the same hold events as the signals and the slow-lock
log (:mod:`django_rlock._observers.reporting`): each backend's :class:`LockMetrics` is
subscribed beside its reporter, and renewals come from the watchdog's
:func:`~django_rlock.core._sync.watchdog.on_renewal`. With ``RLOCK_METRICS`` unset
nothing is subscribed and prometheus_client is not imported.

Several processes (gunicorn workers, Celery prefork children) each count
their own: use prometheus_client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``
set before the processes start, a ``MultiProcessCollector`` serving the sum,
``mark_process_dead`` when a worker exits). The gauge sums the live processes
(``multiprocess_mode="livesum"``). See docs/django.md, "Metrics".
"""

from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, NamedTuple

from django_rlock import _conf as conf
from django_rlock._observers.holdevents import HoldEvents
from django_rlock.backends._types import AliasAttached, AliasBackend
from django_rlock.core._faces import GaveUp, Hold, clock, forking, watchdog

if TYPE_CHECKING:
    from prometheus_client import Counter, Gauge, Histogram


#: The ``lock`` label of a lock named directly rather than built from a template.
NO_TEMPLATE: Final = "-"

#: Histogram buckets in seconds: lock waits and holds run from milliseconds
#: (a short critical section) to minutes (a Celery task), wider than the default's 10 s.
BUCKETS: Final = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    math.inf,
)


@dataclass(frozen=True)
class _Series:
    """The metric families, registered once per process on the default registry."""

    acquisitions: Counter
    wait: Histogram
    hold: Histogram
    lost: Counter
    leaked: Counter
    duplicates: Counter
    deadlocks: Counter
    renewals: Counter
    held: Gauge
    throttled: Counter


_series: _Series | None = None
_series_lock = threading.Lock()


def _get_series() -> _Series:
    global _series  # noqa: PLW0603 -- a metric name registers once per registry and process
    with _series_lock:
        if _series is None:
            _series = _create_series()
            watchdog.on_renewal(_count_renewal)
        return _series


def _create_series() -> _Series:
    from prometheus_client import Counter, Gauge, Histogram  # noqa: PLC0415 -- an optional extra

    per_lock = ["alias", "lock"]
    return _Series(
        acquisitions=Counter(
            "django_rlock_acquisitions",
            "Lock acquire calls, by outcome: acquired, timeout (the wait ran out), "
            "busy (one attempt, the lock was held), deadlock (DeadlockError).",
            [*per_lock, "outcome"],
        ),
        wait=Histogram(
            "django_rlock_wait_seconds",
            "Seconds each lock acquire call waited, granted or not.",
            per_lock,
            buckets=BUCKETS,
        ),
        hold=Histogram(
            "django_rlock_hold_seconds",
            "Seconds each lock hold lasted, from its grant to its last release.",
            per_lock,
            buckets=BUCKETS,
        ),
        lost=Counter("django_rlock_lost", "Lock holds lost while held.", per_lock),
        leaked=Counter(
            "django_rlock_leaked",
            "Lock holds that outlived their owner thread or task, or their request.",
            per_lock,
        ),
        duplicates=Counter(
            "django_rlock_duplicates",
            "Deliveries of a locked Celery task's message dropped as duplicates of a run "
            "of the same task id, by what was found: running, finished.",
            [*per_lock, "found"],
        ),
        deadlocks=Counter(
            "django_rlock_deadlocks",
            "Deadlocks broken: acquire calls that gave up as the victim of a cycle of "
            "waiters (DeadlockError).",
            per_lock,
        ),
        renewals=Counter(
            "django_rlock_renewals",
            "Watchdog renewals of held locks, by outcome: ok, failed, lost.",
            ["outcome"],
        ),
        held=Gauge(
            "django_rlock_held",
            "Locks held by this process now.",
            per_lock,
            multiprocess_mode="livesum",
        ),
        throttled=Counter(
            "django_rlock_throttled",
            "Calls a rate limiter held back, by outcome: refused (nothing taken), "
            "delayed (permits reserved for later).",
            ["alias", "limiter", "outcome"],
        ),
    )


#: The backends whose locks are counted (``RLOCK_METRICS`` was set when they were built).
_metered: weakref.WeakSet[object] = weakref.WeakSet()


def for_backend(backend: AliasBackend) -> LockMetrics | None:
    """The metrics of ``backend``'s locks; None when ``RLOCK_METRICS`` is unset.

    Raises :class:`~django_rlock.exceptions.LockSettingError` for a bad
    ``RLOCK_METRICS`` or a missing prometheus_client.
    """
    if conf.metrics() is None:
        return None
    return LockMetrics(backend)


def _label(lock: AliasAttached) -> str:
    return lock.key_template or NO_TEMPLATE


class _LockChildren(NamedTuple):
    """One lock label's children of the series every grant and release counts in."""

    acquired: Counter
    wait: Histogram
    hold: Histogram
    held: Gauge


class LockMetrics(HoldEvents):
    """Counts the hold events of one backend's locks into the Prometheus series.

    Subscribed beside the backend's :class:`~django_rlock._observers.reporting.Reporter`
    to every lock client it builds, and like it counting only the holds taken
    through locks of its own backend (a client may also serve other aliases).
    """

    def __init__(self, backend: AliasBackend) -> None:
        super().__init__(backend)
        _metered.add(backend)
        self._series = _get_series()
        # lock label -> its series' children: ``labels()`` takes a mutex and
        # builds a key on every call, and a grant and a release touch four.
        # Bounded by the templates in the code ("order:{order_id}", "-").
        self._children: dict[str, _LockChildren] = {}

    def _of(self, label: str) -> _LockChildren:
        """The children of ``label``'s series, which every grant and release counts in."""
        children = self._children.get(label)
        if children is None:
            alias, series = self.backend.alias, self._series
            children = self._children[label] = _LockChildren(
                acquired=series.acquisitions.labels(alias, label, "acquired"),
                wait=series.wait.labels(alias, label),
                hold=series.hold.labels(alias, label),
                held=series.held.labels(alias, label),
            )
        return children

    def _acquired(self, hold: Hold) -> None:
        lock = self._lock_of(hold)
        if lock is None:
            return
        children = self._of(_label(lock))
        children.acquired.inc()
        children.wait.observe(hold.waited)
        children.held.inc()

    def _gave_up(self, event: GaveUp) -> None:
        lock = self._ours(event.lock)
        if lock is None:
            return
        alias, label, series = self.backend.alias, _label(lock), self._series
        if event.deadlock is not None:
            outcome = "deadlock"
            series.deadlocks.labels(alias, label).inc()
        else:
            outcome = "timeout" if event.would_wait else "busy"
        series.acquisitions.labels(alias, label, outcome).inc()
        series.wait.labels(alias, label).observe(event.waited)

    def _released(self, hold: Hold) -> None:
        lock = self._lock_of(hold)
        if lock is None:
            return
        children = self._of(_label(lock))
        children.hold.observe(clock.monotonic() - hold.acquired_at)
        children.held.dec()

    def count_duplicate(self, lock: object, found: str) -> None:
        """Count a delivery of a task locked by ``lock`` dropped as a duplicate (``found``)."""
        ours = self._ours(lock)
        if ours is not None:
            self._series.duplicates.labels(self.backend.alias, _label(ours), found).inc()

    def count_throttled(self, template: str | None, outcome: str) -> None:
        """Count a call held back by a rate limiter built from ``template`` (``outcome``)."""
        self._series.throttled.labels(self.backend.alias, template or NO_TEMPLATE, outcome).inc()

    def _lost(self, hold: Hold) -> None:
        lock = self._lock_of(hold)
        if lock is not None:
            self._series.lost.labels(self.backend.alias, _label(lock)).inc()

    def _leaked(self, hold: Hold, _reason: str) -> None:
        lock = self._lock_of(hold)
        if lock is not None:
            self._series.leaked.labels(self.backend.alias, _label(lock)).inc()


def _count_renewal(hold: Hold, outcome: watchdog.RenewalOutcome) -> None:
    # Process-wide (the watchdog renews every client's holds): count the
    # renewals of the locks whose backend has metrics on.
    lock = hold.locks[0] if hold.locks else None
    if isinstance(lock, AliasAttached) and lock.backend in _metered:
        series = _series
        if series is not None:
            series.renewals.labels(outcome).inc()


@forking.after_fork_in_child
def _renew_lock_after_fork() -> None:
    # The series themselves carry on in the child (multiprocess mode writes
    # them to the child's own files); only a lock another thread held is reset.
    global _series_lock  # noqa: PLW0603
    _series_lock = threading.Lock()
