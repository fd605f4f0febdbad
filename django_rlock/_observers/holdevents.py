"""What the reporter and the metrics share: the hold events of one backend's locks.

A lock client's :class:`~django_rlock.core._protocol.holds.HoldRegistry` tells
its subscribers of every hold granted, released, lost, given up on or leaked.
A client may also serve ``cache.lock()`` or another alias, so an observer of
one backend (:class:`~django_rlock._observers.reporting.Reporter`,
:class:`~django_rlock._observers.metrics.LockMetrics`) keeps only the events
of the locks that backend handed out: :meth:`HoldEvents._lock_of`.
"""

from __future__ import annotations

from django_rlock.backends._types import AliasAttached, AliasBackend
from django_rlock.core._faces import GaveUp, Hold, HoldRegistry


class HoldEvents:
    """Subscribes its five handlers to a lock client's holds; a subclass writes them."""

    def __init__(self, backend: AliasBackend) -> None:
        self.backend = backend

    def attach(self, registry: HoldRegistry) -> None:
        """Watch the holds of ``registry`` (a lock client's) from now on."""
        registry.on_acquired(self._acquired)
        registry.on_released(self._released)
        registry.on_lost(self._lost)
        registry.on_gave_up(self._gave_up)
        registry.on_leaked(self._leaked)

    def detach(self, registry: HoldRegistry) -> None:
        """Stop watching the holds of ``registry`` (a client that outlives the backend)."""
        registry.unsubscribe(
            self._acquired, self._released, self._lost, self._gave_up, self._leaked
        )

    def _ours(self, lock: object) -> AliasAttached | None:
        """``lock`` if this backend handed it out, else None."""
        if isinstance(lock, AliasAttached) and lock.backend is self.backend:
            return lock
        return None

    def _lock_of(self, hold: Hold) -> AliasAttached | None:
        """The lock ``hold`` was taken through, if this backend handed it out."""
        return self._ours(hold.locks[0]) if hold.locks else None

    def _acquired(self, hold: Hold) -> None:
        """A new hold was granted, on the acquiring thread."""
        raise NotImplementedError

    def _released(self, hold: Hold) -> None:
        """An owner's last hold was given back, on the releasing thread."""
        raise NotImplementedError

    def _lost(self, hold: Hold) -> None:
        """A hold was found lost (expired, or taken over)."""
        raise NotImplementedError

    def _gave_up(self, event: GaveUp) -> None:
        """An acquire ended without the lock (busy, timed out, deadlock)."""
        raise NotImplementedError

    def _leaked(self, hold: Hold, reason: str) -> None:
        """A hold outlived its owner (``reason`` says how it was found)."""
        raise NotImplementedError
