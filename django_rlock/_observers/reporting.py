"""What the Django face adds to every lock: signals and the slow-lock log.

Each backend has a :class:`Reporter`, subscribed to the hold events of every
lock client the backend builds (the engine's
:class:`~django_rlock.core._protocol.holds.HoldRegistry`, which alone counts holds). So a
lock taken through ``locks[alias]`` is reported however it is used (``with``,
``acquire()``/``release()``, a decorator, a Celery task, sync or asyncio):

* :data:`~django_rlock.signals.lock_acquired` when the caller goes from no hold
  to one, :data:`~django_rlock.signals.lock_released` when it gives back its
  last, :data:`~django_rlock.signals.lock_lost` when a hold is lost;
* a WARNING on the ``django_rlock.slow`` logger when a wait took longer than
  ``SLOW_WAIT`` seconds or a hold lasted longer than ``SLOW_HOLD``, naming the
  lock, its alias, the seconds and the code location that took the lock;
* a WARNING on ``django_rlock.lock`` naming the cycle and
  :data:`~django_rlock.signals.lock_deadlock` when an acquire gave up to
  break a deadlock;
* an ERROR on ``django_rlock.lock`` and :data:`~django_rlock.signals.lock_leaked`
  when a hold outlived its thread, task or request (:mod:`django_rlock.core._process.leaks`,
  :mod:`django_rlock._scopes.requests`), naming the code that took it.

With ``RLOCK_METRICS`` set, the reporter also subscribes the backend's
:class:`~django_rlock._observers.metrics.LockMetrics` wherever it is attached itself.
"""

from __future__ import annotations

import logging
import weakref

from django_rlock._callsite import caller_location
from django_rlock._observers.holdevents import HoldEvents
from django_rlock._observers.metrics import LockMetrics, for_backend
from django_rlock.backends._types import AliasAttached, AliasBackend
from django_rlock.core._faces import GaveUp, Hold, HoldRegistry, clock, lock_order
from django_rlock.signals import (
    lock_acquired,
    lock_deadlock,
    lock_leaked,
    lock_lost,
    lock_released,
)

slow_logger = logging.getLogger("django_rlock.slow")
logger = logging.getLogger("django_rlock.lock")


#: Each backend's reporter, for the code that holds only one of its locks
#: (``lock.backend``): the locks do not know the class of the backend.
_reporters: weakref.WeakKeyDictionary[object, Reporter] = weakref.WeakKeyDictionary()


def reporter_of(backend: object) -> Reporter | None:
    """The :class:`Reporter` of ``backend`` (a lock's ``backend``); None for another object."""
    return _reporters.get(backend)


class Reporter(HoldEvents):
    """Turns the hold events of one backend's locks into signals and slow-lock log lines.

    :meth:`attach` subscribes it to a lock client's registry; it reports only
    the holds taken through locks of its own backend (a cache's lock client
    may also serve ``cache.lock()`` or another alias). The one thing it notes
    is where each hold was taken (on the hold, ``hold.location``), for the
    slow-hold and the leak lines.
    """

    def __init__(self, backend: AliasBackend) -> None:
        super().__init__(backend)
        _reporters[backend] = self
        #: The backend's Prometheus metrics; None when ``RLOCK_METRICS`` is unset.
        self.metrics: LockMetrics | None = for_backend(backend)

    def attach(self, registry: HoldRegistry) -> None:
        """Report the holds of ``registry`` (a lock client's) from now on."""
        super().attach(registry)
        registry.release_leaked = self.backend.leaked == "release"
        if self.backend.lock_order_check:
            lock_order.watch(registry)
        if self.metrics is not None:
            self.metrics.attach(registry)

    def detach(self, registry: HoldRegistry) -> None:
        """Stop reporting the holds of ``registry`` (a client that outlives the backend)."""
        super().detach(registry)
        if self.metrics is not None:
            self.metrics.detach(registry)

    def _acquired(self, hold: Hold) -> None:
        # _lock_of inlined: run on every grant of every lock of the client.
        lock = hold.locks[0] if hold.locks else None
        backend = self.backend
        if not isinstance(lock, AliasAttached) or lock.backend is not backend:
            return
        # On the acquiring thread (or task): the call stack is the caller's.
        # Always kept: a leak report must say which code took the hold.
        location = hold.location = lock.location or caller_location()
        if backend.slow_wait is not None:
            self._log_slow_wait(lock.name, hold.waited, location, acquired=True)
        if lock_acquired.receivers:  # else send() finds nobody, after its keywords are built
            lock_acquired.send(
                sender=type(backend),
                name=lock.name,
                alias=backend.alias,
                lock=lock,
                waited=hold.waited,
            )

    def _gave_up(self, event: GaveUp) -> None:
        lock = self._ours(event.lock)
        if lock is None:
            return
        if event.deadlock is not None:
            self._deadlocked(lock, event)
        location = lock.location
        if location is None and self.backend.slow_wait is not None:
            location = caller_location()
        self._log_slow_wait(lock.name, event.waited, location, acquired=False)

    def _deadlocked(self, lock: AliasAttached, event: GaveUp) -> None:
        error = event.deadlock
        assert error is not None  # only called for a deadlock's event
        backend = self.backend
        # The message names every lock and holder of the cycle, never an owner id.
        logger.warning(
            "%s (alias %r)",
            error,
            backend.alias,
            extra={"lock_name": lock.name, "alias": backend.alias, "seconds": event.waited},
        )
        lock_deadlock.send(
            sender=type(backend),
            name=lock.name,
            alias=backend.alias,
            lock=lock,
            cycle=error.cycle,
            waited=event.waited,
            error=error,
        )

    def _released(self, hold: Hold) -> None:
        lock = hold.locks[0] if hold.locks else None  # _lock_of inlined, as in _acquired
        backend = self.backend
        if not isinstance(lock, AliasAttached) or lock.backend is not backend:
            return
        location = hold.location
        held = clock.monotonic() - hold.acquired_at
        if not hold.lost:
            backend.hold_times.observe(lock.name, lock.key_template, held)
        if backend.slow_hold is not None and held > backend.slow_hold:
            slow_logger.warning(
                "slow lock hold: %r (alias %r) held %.3fs, taken at %s",
                lock.name,
                backend.alias,
                held,
                location or "an unknown location",
                extra={"lock_name": lock.name, "alias": backend.alias, "seconds": held},
            )
        if lock_released.receivers:
            lock_released.send(
                sender=type(backend),
                name=lock.name,
                alias=backend.alias,
                lock=lock,
                held=held,
                lost=hold.lost,
            )

    def _lost(self, hold: Hold) -> None:
        if hold.locks:
            self.report_lost(hold.locks[0])

    def _leaked(self, hold: Hold, reason: str) -> None:
        lock = self._lock_of(hold)
        if lock is None:
            return
        backend = self.backend
        location = hold.location
        held = clock.monotonic() - hold.acquired_at
        released = backend.leaked == "release"
        logger.error(
            "lock %r (alias %r) leaked: %s; held %.3fs, taken at %s; %s",
            lock.name,
            backend.alias,
            reason,
            held,
            location or "an unknown location",
            "released now"
            if released
            else "not renewed, it expires by itself (RLOCK_LEAKED = 'warn')",
            extra={"lock_name": lock.name, "alias": backend.alias, "seconds": held},
        )
        lock_leaked.send(
            sender=type(backend),
            name=lock.name,
            alias=backend.alias,
            lock=lock,
            reason=reason,
            held=held,
            location=location,
            released=released,
        )

    def report_lost(self, lock: object) -> None:
        """Send :data:`lock_lost` for ``lock`` (if it is this backend's).

        The engine reports every loss it sees; this is for one only its caller
        saw (a release retried after a lost reply that finds nothing held).
        """
        ours = self._ours(lock)
        if ours is not None:
            backend = self.backend
            lock_lost.send(sender=type(backend), name=ours.name, alias=backend.alias, lock=ours)

    def _log_slow_wait(
        self, name: str, waited: float, location: str | None, *, acquired: bool
    ) -> None:
        backend = self.backend
        if backend.slow_wait is not None and waited > backend.slow_wait:
            slow_logger.warning(
                "slow lock wait: %r (alias %r) waited %.3fs%s at %s",
                name,
                backend.alias,
                waited,
                "" if acquired else " and timed out",
                location or "an unknown location",
                extra={"lock_name": name, "alias": backend.alias, "seconds": waited},
            )
