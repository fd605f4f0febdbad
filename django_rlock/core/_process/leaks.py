"""Holds that outlive their owner: found, told, and given back.

An owner is a thread or an asyncio task (:mod:`django_rlock.core._process.identity`).
A hold whose owner has ended can never be released by it, and before this
module the watchdog renewed such a hold for as long as the process lived.
Now:

* the watchdog never renews a hold whose owner is gone
  (:func:`~django_rlock.core._process.identity.owner_alive`, checked at every tick);
* a thread that ended holding is found at the watchdog's next tick (at most
  ``watchdog_timeout / 3`` later), a task that finished holding at once, on
  its event loop, as it ends;
* each such hold, if the watchdog renews it (a hold taken with a ``lease``
  ends with its lease, by design), is reported once (:meth:`HoldRegistry.report_leaked
  <django_rlock.core._protocol.holds.HoldRegistry.report_leaked>`: the registry's
  ``on_leaked`` subscribers, or a WARNING on ``django_rlock.lock``) and, when
  the registry's ``release_leaked`` is true (the default), given back on the
  server as its owner would have (every hold it counted), so that the next
  waiter gets the lock now rather than a watchdog timeout later.

With ``release_leaked`` false the hold is only reported and left to expire
(within the watchdog timeout, as if its process had died).

A third finder is the end of a unit of work on a thread that lives on: a
request (:mod:`django_rlock._requests`) or a Celery task run
(:mod:`celery_rlock._worker`) calls :func:`work_started` and :func:`work_ended`,
and the holds the thread took in between and still has are leaked. They are
given back at once, so the thread's next request or task (same thread, same
owner id) can never re-enter them; when they are only reported
(``release_leaked`` false), the thread takes a new owner id instead, if it
holds nothing older, and the next unit of work waits for them like anyone else.
"""

from __future__ import annotations

import logging
import threading

from django_rlock.core._process import identity
from django_rlock.core._protocol import clock
from django_rlock.core._protocol.holds import Hold, HoldRegistry, registries

logger = logging.getLogger("django_rlock.lock")


# Per thread: when each unit of work under way began (nested: a stack).
_work = threading.local()


def work_started() -> None:
    """The calling thread begins a unit of work whose holds must end with it."""
    stack: list[float] | None = getattr(_work, "started", None)
    if stack is None:
        stack = _work.started = []
    stack.append(clock.monotonic())


def work_ended(what: str) -> None:
    """The unit of work the calling thread began last has ended: what it kept is leaked.

    ``what`` names it in the report ("request", "task run"). Each watchdog hold
    the thread took since :func:`work_started` and still has is reported and,
    with the registry's ``release_leaked``, given back.
    """
    stack: list[float] | None = getattr(_work, "started", None)
    if not stack:
        return  # a unit of work this module did not see begin
    since = stack.pop()
    owner = identity.thread_owner()
    reason = f"the {what} that took it ended without releasing it"
    kept = False
    for registry in registries():
        for hold in registry.holds_owned_by(owner):
            if hold.acquired_at < since or not registry.report_leaked(hold, reason):
                continue
            if registry.release_leaked:
                give_back(hold)
            else:
                kept = True
    older = (hold for registry in registries() for hold in registry.holds_owned_by(owner))
    if kept and all(hold.leaked for hold in older):
        # Only reported, the holds are still this owner's on the server: under a
        # new owner id the thread's next unit of work cannot re-enter them.
        identity.retire_thread_owner()


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
