"""Owner identity: who a hold belongs to.

An owner id is ``<process id>:<thread number>``. The process id is a random
UUID (122 random bits), made anew in every forked child, so a child never
passes for its parent (it cannot release the parent's locks, and the parent's
holds are not its own). A thread's owner id thus has the shape of a Redisson
lock owner, ``<client UUID>:<Java thread id>`` (a decimal number), in every
layout: a Java tool that reads a lock hash's fields reads ours too
(``layout="redisson"``, docs/redisson.md).
The thread number is given to each thread on first use and never given again in
this process: ``threading.get_ident()`` values are reused once a thread ends,
and a new thread must not inherit a dead thread's holds.
The id is a credential: it must never appear in logs, reprs or error messages.

Each owner id of this process also remembers, weakly, the thread or task it
names, so that the engine can tell an owner that has ended (:func:`owner_alive`):
a hold whose owner is gone can never be released by it, and the watchdog must
not keep it alive. A task's end is also announced (:func:`on_task_end`), at
once, on its event loop.

An owner has ended only when that is certain, never on a guess: a worker
thread that has returned, a task that is done. The main thread is the
exception: when it returns while non-daemon threads still run, the process
goes on, and so may the work its holds guard (a script that starts workers
and returns). Its holds are the process's, and end with it
(:mod:`django_rlock.core._process.leaks` gives them back at exit).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import threading
import uuid
import weakref
from collections.abc import Callable
from typing import Any

from django_rlock.core._process import forking

logger = logging.getLogger("django_rlock.lock")


_process_id = str(uuid.uuid4())


_thread_numbers = itertools.count(1)  # next() is atomic under the GIL


class _ThreadIds(threading.local):
    """Per thread: its owner id and its former ids (class attributes: the unset defaults).

    Defaults on the class, not ``getattr(..., None)``: a missing attribute of a
    thread-local costs an AttributeError raised and caught, on every lock call.
    """

    owner: str | None = None
    former: list[str] | None = None


_local = _ThreadIds()


_task_owners: weakref.WeakKeyDictionary[asyncio.Task[object], str] = weakref.WeakKeyDictionary()


# Owner id -> its thread or task, weakly; an entry goes with its subject.
_subjects: dict[str, weakref.ref[Any]] = {}


# Owner ids retired by another thread than their own (retire_owner) -> whether
# the thread keeps it as a former id (it still holds locks under it): the thread
# takes a new owner id at its next lock call. Read on every thread_owner() call,
# so a dict (membership is one hash lookup) that is almost always empty.
_retired: dict[str, bool] = {}


# Called with a task's owner id when that task is done (see on_task_end).
_task_end_hooks: list[Callable[[str], object]] = []


def process_id() -> str:
    """The random id of this process (regenerated after ``fork``)."""
    return _process_id


def thread_owner() -> str:
    """The owner id of the calling thread in this process."""
    owner: str | None = _local.owner
    # After a fork the surviving thread keeps its local: rebuild it for the new id.
    if owner is None or not owner.startswith(_process_id) or (_retired and owner in _retired):
        if owner is not None and _retired.pop(owner, False):
            _keep_former(owner)
        owner = f"{_process_id}:{next(_thread_numbers)}"
        _local.owner = owner
        _remember(owner, threading.current_thread())
    return owner


def retire_thread_owner(*, keep: bool = False) -> None:
    """The calling thread takes a new owner id from its next lock call on.

    What it acquires from then on is held under the new id, so it cannot
    re-enter the holds a unit of work left under the old one (a lease, a leak
    only reported). With ``keep``, the thread still holds older locks under the
    old id (taken before that unit): it stays one of the thread's ids
    (:func:`former_thread_owners`), under which the thread re-enters and
    releases those locks, and its owner stays alive for the watchdog.
    """
    owner: str | None = _local.owner
    if owner is not None:
        _local.owner = None
        if keep:
            _keep_former(owner)
        else:
            _subjects.pop(owner, None)


def retire_owner(owner: str, *, keep: bool = False) -> None:
    """:func:`retire_thread_owner` for the thread named by ``owner``, called from another.

    The thread switches at its next lock call (a request's executor thread
    whose unit of work ended). Ids of tasks are not retired: a task's units
    of work end with it.
    """
    if is_task_owner(owner):
        return
    _retired[owner] = keep
    if not keep:
        _subjects.pop(owner, None)


def former_thread_owners() -> list[str]:
    """The calling thread's former owner ids that may still hold locks, newest first."""
    former: list[str] | None = _local.former
    if not former:
        return []
    if not former[0].startswith(_process_id):  # a forked child: the parent's ids
        _local.former = []
        return []
    return former


def forget_former_thread_owner(owner: str) -> None:
    """``owner``, a former id of the calling thread, holds nothing any more."""
    former: list[str] | None = _local.former
    if former and owner in former:
        former.remove(owner)
        _subjects.pop(owner, None)


def _keep_former(owner: str) -> None:
    former: list[str] | None = _local.former
    if former is None:
        former = _local.former = []
    former.insert(0, owner)


def is_task_owner(owner: str) -> bool:
    """Whether ``owner`` names an asyncio task (else a thread) of any process."""
    return ":task-" in owner


def task_owner() -> str:
    """The owner id of the current asyncio task: each task is its own owner.

    Tasks on one thread (``asyncio.gather`` children included) exclude each
    other as threads do. Raises RuntimeError outside a task.
    """
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("an async lock must be used from inside an asyncio task")
    return _owner_of_task(task)


def _owner_of_task(task: asyncio.Task[Any]) -> str:
    owner = _task_owners.get(task)
    if owner is None or not owner.startswith(_process_id):
        owner = f"{_process_id}:task-{next(_thread_numbers)}"
        _task_owners[task] = owner
        _remember(owner, task)
        task.add_done_callback(functools.partial(_task_ended, owner))
    return owner


def current_task_owner() -> str | None:
    """The current task's owner id, or None outside a task (see :func:`task_owner`)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    task = asyncio.current_task(loop)  # looked up once: every async lock call asks
    return _owner_of_task(task) if task is not None else None


def owner_alive(owner: str) -> bool:
    """False when ``owner`` is a thread of this process that has ended, or a task that is done.

    An owner id this process did not make (another process's) is taken as
    alive: only its own process can tell. The main thread lives as long as
    the process: non-daemon threads may go on after it returns (see the module).
    """
    ref = _subjects.get(owner)
    if ref is None:
        return not owner.startswith(f"{_process_id}:")
    subject = ref()
    if subject is None:
        return False
    if isinstance(subject, threading.Thread):
        return subject.is_alive() or subject is threading.main_thread()
    return not subject.done()


def owners_of(thread: threading.Thread) -> list[str]:
    """The owner ids of this process that name ``thread`` (one, or none if it never locked)."""
    return [owner for owner, ref in list(_subjects.items()) if ref() is thread]


def on_task_end(hook: Callable[[str], object]) -> None:
    """Call ``hook(owner)`` on its event loop when a task that owned an owner id is done."""
    _task_end_hooks.append(hook)


def _remember(owner: str, subject: threading.Thread | asyncio.Task[Any]) -> None:
    def forget(_: weakref.ref[Any]) -> None:
        _subjects.pop(owner, None)

    _subjects[owner] = weakref.ref(subject, forget)


def _task_ended(owner: str, _task: asyncio.Task[Any]) -> None:
    for hook in list(_task_end_hooks):
        try:
            hook(owner)
        except Exception:
            logger.exception("task end hook %r failed", hook)


@forking.after_fork_in_child
def _regenerate_after_fork() -> None:
    global _process_id  # noqa: PLW0603 -- the id is process state by definition
    _process_id = str(uuid.uuid4())
    _subjects.clear()  # the parent's threads and tasks are not this process's
    _retired.clear()
