"""Signals sent for every lock taken through :data:`django_rlock.locks`.

That covers ``rlock()``, ``@locked``, Celery's ``LockedTask`` and any
``locks[alias].lock(name)`` of your own. Locks made by a bare
:class:`django_rlock.core.LockClient` or by ``cache.lock()`` send nothing.

Every signal's ``sender`` is the backend class; connect with
``sender=RedisLockBackend`` to hear one kind of backend only, or filter on
``alias``. Receivers run in the thread that took or released the lock, except
``lock_lost``, which runs on a short-lived thread of the watchdog's.
"""

from __future__ import annotations

from django.dispatch import Signal

__all__ = ["lock_acquired", "lock_deadlock", "lock_leaked", "lock_lost", "lock_released"]

#: Sent when a caller goes from holding nothing to holding the lock (re-entries
#: send nothing). Arguments: ``name`` (the lock name), ``alias`` (the RLOCKS
#: alias), ``lock`` (the RLock), ``waited`` (seconds spent waiting for it).
lock_acquired = Signal()

#: Sent when a caller gives back its last hold on the lock. Arguments: ``name``,
#: ``alias``, ``lock``, ``held`` (seconds since ``lock_acquired``), ``lost``
#: (True when the hold had already been lost, and the release raised LockLostError).
lock_released = Signal()

#: Sent when a hold is lost: its key expired or another owner took it while the
#: holder still believed it held it. Arguments: ``name``, ``alias``, ``lock``.
lock_lost = Signal()

#: Sent when a hold outlived what took it: its thread ended, its asyncio task
#: finished, or its request finished, still holding it. Arguments: ``name``,
#: ``alias``, ``lock``, ``reason`` (which of these), ``held`` (seconds since it
#: was taken), ``location`` (the code that took it, ``path:line in function``,
#: or None), ``released`` (True when it is given back now, ``RLOCK_LEAKED =
#: "release"``; False when it is left to expire, ``"warn"``). Sent on the thread
#: that noticed: the request's, the ended task's event loop, or the watchdog's.
lock_leaked = Signal()

#: Sent when an acquire call gave up to break a deadlock (it raises
#: :class:`~django_rlock.exceptions.DeadlockError`), on the caller's thread,
#: after it left the wait-for graph. Arguments: ``name``, ``alias``, ``lock``,
#: ``cycle`` (the error's: each lock of the cycle with its holder), ``waited``
#: (seconds the call waited), ``error`` (the DeadlockError).
lock_deadlock = Signal()
