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

A third finder is the end of a unit of work: a request
(:mod:`django_rlock._scopes.requests`) or a Celery task run (:mod:`django_rlock._scopes.taskruns`)
calls :func:`work_started` and :func:`work_ended`, and the holds granted in
between (:mod:`~django_rlock.core._process.scopes`: on whatever thread or task
the unit's code ran, executor threads included) that are still held are
leaked: reported and, with ``release_leaked``, given back at once, so the
thread's next request or task (same thread, same owner id) can never
re-enter them. A hold taken with a ``lease`` is not leaked (it ends with its
lease, by design: a throttle takes one and keeps it); when a unit leaves
such holds, or leaked holds only reported
(``release_leaked`` false), their thread takes a new owner id, if it holds
nothing older, so that its next unit of work waits for them like anyone else.

What is never a leak, because its owner has not provably ended: a hold of
the main thread after it returns while other threads run (the process goes
on; its holds are given back as it exits, :func:`process_exiting`), a hold
of a task that awaits the grant of a coroutine run in another task
(``asyncio.wait_for``, ``shield``: the owner is bound when ``acquire()`` is
called).
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable, Iterable

from django_rlock.core._process import identity, scopes
from django_rlock.core._process.kept import HoldKeeper, KeptHold

logger = logging.getLogger("django_rlock.lock")


def _no_keepers() -> Iterable[HoldKeeper]:
    return ()


#: Every live hold registry of the process, as ``_protocol/holds.py`` hands it
#: over (:func:`keepers_from`): this floor imports nothing above it.
_keepers: Callable[[], Iterable[HoldKeeper]] = _no_keepers


def keepers_from(every: Callable[[], Iterable[HoldKeeper]]) -> None:
    """Read the process's hold registries from ``every`` (set once, by ``_protocol/holds.py``)."""
    global _keepers  # noqa: PLW0603 -- one process-wide source, set once at import
    _keepers = every


def work_started(what: str = "unit of work") -> None:
    """A unit of work begins in the calling code's context; its holds must end with it."""
    scopes.begin(what)


def work_ended(what: str) -> None:
    """The unit of work begun last in the calling code's context has ended: what it kept is leaked.

    ``what`` names it in the report ("request", "task run"). Each watchdog hold
    granted in it and still held is reported and, with the registry's
    ``release_leaked``, given back; a thread that keeps holds of it (a lease,
    a report only) takes a new owner id, if it holds nothing older.
    """
    scope = scopes.end()
    if scope is None:
        return  # a unit of work this module did not see begin
    reason = f"the {what} that took it ended without releasing it"
    kept: dict[str, list[KeptHold]] = {}  # thread owners -> the holds of this unit they keep
    for hold in list(scope.holds):
        if hold.released or hold.lost:
            continue
        if identity.is_task_owner(hold.owner):
            continue  # a task's holds end with the task, on its own event loop
        registry = next((each for each in _keepers() if each.keeps(hold)), None)
        reported = registry is not None and registry.report_leaked(hold, reason)
        if reported and registry is not None and registry.release_leaked:
            give_back(hold)
            continue
        if not hold.released:
            kept.setdefault(hold.owner, []).append(hold)
    for owner, holds in kept.items():
        # The holds are still this owner's on the server, and nobody will release
        # them (a lease runs to its end, a reported leak expires): the registry
        # stops keeping them, and the thread takes a new owner id, so that its
        # next unit of work cannot re-enter them. Holds it took before this unit
        # stay under the old id, which it keeps for them.
        for registry in _keepers():
            registry.forget_holds(holds)
        older = any(registry.owns_any(owner) for registry in _keepers())
        if owner == identity.thread_owner():
            identity.retire_thread_owner(keep=older)
        else:
            identity.retire_owner(owner, keep=older)


def thread_gone(registry: HoldKeeper, hold: KeptHold) -> None:
    """The watchdog found ``hold``'s owner thread ended: report it, give it back.

    The release calls run on a short-lived thread of their own, so a slow
    server delays no renewal of the other locks.
    """
    reason = "the thread that took it ended without releasing it"
    if registry.report_leaked(hold, reason) and registry.release_leaked:
        threading.Thread(target=give_back, args=(hold,), name="rlock-leaked", daemon=True).start()


def give_back(hold: KeptHold) -> None:
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
    for registry in _keepers():
        for hold in registry.holds_owned_by(owner):
            reason = "the asyncio task that took it finished without releasing it"
            if registry.report_leaked(hold, reason) and registry.release_leaked:
                give_back(hold)


def process_exiting() -> None:
    """The process exits: the main thread's holds, kept until now, are given back.

    Run by :mod:`atexit`, after Python has joined the non-daemon threads:
    the work those holds guarded is over. Reported as leaks (nobody released
    them), then given back with ``release_leaked``; else they expire.
    """
    reason = "the process exited without releasing it"
    for owner in identity.owners_of(threading.main_thread()):
        for registry in _keepers():
            for hold in registry.holds_owned_by(owner):
                if registry.report_leaked(hold, reason) and registry.release_leaked:
                    give_back(hold)


identity.on_task_end(_task_ended)
atexit.register(process_exiting)
