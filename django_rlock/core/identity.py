"""Owner identity: who a hold belongs to.

An owner id is ``<process id>:<thread number>``. The process id is 128 random
bits, made anew in every forked child, so a child never passes for its parent
(it cannot release the parent's locks, and the parent's holds are not its own).
The thread number is given to each thread on first use and never given again in
this process: ``threading.get_ident()`` values are reused once a thread ends,
and a new thread must not inherit a dead thread's holds.
The id is a credential: it must never appear in logs, reprs or error messages.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import threading
import weakref

from django_rlock.core import forking

__all__ = ["process_id", "task_owner", "thread_owner"]

_process_id = secrets.token_hex(16)
_thread_numbers = itertools.count(1)  # next() is atomic under the GIL
_local = threading.local()
_task_owners: weakref.WeakKeyDictionary[asyncio.Task[object], str] = weakref.WeakKeyDictionary()


def process_id() -> str:
    """The random id of this process (regenerated after ``fork``)."""
    return _process_id


def thread_owner() -> str:
    """The owner id of the calling thread in this process."""
    owner: str | None = getattr(_local, "owner", None)
    # After a fork the surviving thread keeps its local: rebuild it for the new id.
    if owner is None or not owner.startswith(_process_id):
        owner = f"{_process_id}:{next(_thread_numbers)}"
        _local.owner = owner
    return owner


def task_owner() -> str:
    """The owner id of the current asyncio task: each task is its own owner.

    Tasks on one thread (``asyncio.gather`` children included) exclude each
    other as threads do. Raises RuntimeError outside a task.
    """
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("an async lock must be used from inside an asyncio task")
    owner = _task_owners.get(task)
    if owner is None or not owner.startswith(_process_id):
        owner = f"{_process_id}:task-{next(_thread_numbers)}"
        _task_owners[task] = owner
    return owner


@forking.after_fork_in_child
def _regenerate_after_fork() -> None:
    global _process_id  # noqa: PLW0603 -- the id is process state by definition
    _process_id = secrets.token_hex(16)
