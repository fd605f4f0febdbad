"""Holds that outlive their owner: found, told, and given back.

An owner is a thread or an asyncio task (:mod:`django_rlock.core.identity`).
A hold whose owner has ended can never be released by it, and before this
module the watchdog renewed such a hold for as long as the process lived.
Now:

* the watchdog never renews a hold whose owner is gone
  (:func:`~django_rlock.core.identity.owner_alive`, checked at every tick);
* a thread that ended holding is found at the watchdog's next tick (at most
  ``watchdog_timeout / 3`` later), a task that finished holding at once, on
  its event loop, as it ends;
* each such hold, if the watchdog renews it (a hold taken with a ``lease``
  ends with its lease, by design), is reported once (:meth:`HoldRegistry.report_leaked
  <django_rlock.core.hold.HoldRegistry.report_leaked>`: the registry's
  ``on_leaked`` subscribers, or a WARNING on ``django_rlock.lock``) and, when
  the registry's ``release_leaked`` is true (the default), given back on the
  server as its owner would have (every hold it counted), so that the next
  waiter gets the lock now rather than a watchdog timeout later.

With ``release_leaked`` false the hold is only reported and left to expire
(within the watchdog timeout, as if its process had died).

The Django face adds a third finder: holds a request took and did not give
back by the time it finished (:mod:`django_rlock.requests`).
"""

from __future__ import annotations

import logging
import threading

from django_rlock.core import identity
from django_rlock.core.hold import Hold, HoldRegistry, registries

__all__ = ["give_back", "thread_gone"]

logger = logging.getLogger("django_rlock.lock")


def thread_gone(registry: HoldRegistry, hold: Hold) -> None:
    """The watchdog found ``hold``'s owner thread ended: report it, give it back.

    The release calls run on a short-lived thread of their own, so a slow
    server delays no renewal of the other locks.
    """
    reason = "the thread that took it ended without releasing it"
    if registry.report_leaked(hold, reason) and registry.release_leaked:
        threading.Thread(target=give_back, args=(hold,), name="rlock-leaked", daemon=True).start()


def give_back(hold: Hold) -> None:
    """Release every hold ``hold``'s owner counts, through the lock that took it.

    For a lock of the thread engine; run on any thread (the owner is named,
    not taken from the caller). Failures are logged: the hold then expires
    by itself, as it is no longer renewed.
    """
    lock = hold.locks[0] if hold.locks else None
    if lock is None:
        return
    try:
        lock.give_back_leaked(hold)
    except Exception as error:  # noqa: BLE001 -- any failure leaves the key to expire
        logger.warning(
            "could not release the leaked lock %r (%s): it expires by itself", hold.name, error
        )


def _task_ended(owner: str) -> None:
    # On the task's event loop, as it finishes: its locks' asyncio clients live here.
    for registry in registries():
        for hold in registry.holds_owned_by(owner):
            reason = "the asyncio task that took it finished without releasing it"
            if registry.report_leaked(hold, reason) and registry.release_leaked:
                give_back(hold)


identity.on_task_end(_task_ended)
