"""Owner identity: who a hold belongs to.

An owner id is ``<process id>:<thread id>``. The process id is 128 random bits,
made anew in every forked child, so a child never passes for its parent (it
cannot release the parent's locks, and the parent's holds are not its own).
The id is a credential: it must never appear in logs, reprs or error messages.
"""

from __future__ import annotations

import os
import secrets
import threading

__all__ = ["process_id", "thread_owner"]

_process_id = secrets.token_hex(16)


def process_id() -> str:
    """The random id of this process (regenerated after ``fork``)."""
    return _process_id


def thread_owner() -> str:
    """The owner id of the calling thread in this process."""
    return f"{_process_id}:{threading.get_ident()}"


def _regenerate_after_fork() -> None:
    global _process_id  # noqa: PLW0603 -- the id is process state by definition
    _process_id = secrets.token_hex(16)


os.register_at_fork(after_in_child=_regenerate_after_fork)
