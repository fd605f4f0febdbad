"""Every default of the engine, and the renewal timing derived from the watchdog timeout.

The Django settings (:mod:`django_rlock._conf`), the Celery-only settings
(:mod:`celery_rlock._conf`) and the engine's own keyword defaults all take their
values from here, so a default changed here changes everywhere.

Renewal timing is one rule with three parts, kept together because they must
agree: a watchdog hold's key lives :data:`DEFAULT_WATCHDOG_TIMEOUT` seconds past
its last renewal; the watchdog renews every :func:`renewal_interval` (a third
of the timeout); and no renewal call may take longer than
:func:`renewal_socket_timeout` (half an interval), so a call that hangs ends
before the next tick and the last attempt before a deadline ends before the
deadline.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "DEFAULT_DEADLOCK_TIMEOUT",
    "DEFAULT_KEY_PREFIX",
    "DEFAULT_LOCK_ALIAS",
    "DEFAULT_REPLICA_SYNC_TIMEOUT",
    "DEFAULT_WATCHDOG_TIMEOUT",
    "MIN_WATCHDOG_TIMEOUT",
    "renewal_interval",
    "renewal_socket_timeout",
]

#: The namespace of every lock key unless a prefix is given.
DEFAULT_KEY_PREFIX: Final = "rlock"

#: The lock server used unless a call names another (``using=``): the Django
#: ``RLOCKS`` alias, and the one server of the Celery-only settings.
DEFAULT_LOCK_ALIAS: Final = "default"

#: Seconds an acquire waits for its replicas to confirm (``min_replicas``).
DEFAULT_REPLICA_SYNC_TIMEOUT: Final = 1.0

#: Seconds a waiter waits before it looks for a deadlock, then between two looks
#: (PostgreSQL's ``deadlock_timeout``); None turns detection off.
DEFAULT_DEADLOCK_TIMEOUT: Final = 1.0

#: Seconds a watchdog hold outlives its last renewal (Redisson's lockWatchdogTimeout).
DEFAULT_WATCHDOG_TIMEOUT: Final = 30.0

#: The shortest watchdog timeout (seconds). Renewals run every timeout/3 and
#: each call is bounded by timeout/6 (83 ms at 0.5 s). Measured on a loaded
#: 2-core machine (load 5-6), 20 locks held 20 s: at 0.1 s every lock was
#: lost, at 0.2 s all 20 in one run of two, at 0.3 s renewals timed out; at
#: 0.5 s and above none failed.
MIN_WATCHDOG_TIMEOUT: Final = 0.5


def renewal_interval(watchdog_timeout: float) -> float:
    """Seconds between two renewals of a watchdog hold: a third of the timeout.

    Two renewals may fail in a row before the key expires.
    """
    return watchdog_timeout / 3


def renewal_socket_timeout(watchdog_timeout: float) -> float:
    """The longest one renewal call may take: half a renewal interval (timeout / 6).

    Bounds the renewal connection's socket and connect timeouts, and is the
    margin the watchdog keeps before a hold's deadline.
    """
    return renewal_interval(watchdog_timeout) / 2
