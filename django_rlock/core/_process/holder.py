"""Who holds a lock, as an operator sees it: host, pid, thread or task, Celery task.

A new grant writes this beside the owner's hold count, in the lock's own hash
(fields :data:`HOLDER_FIELD` and :data:`SINCE_FIELD`), in the same script call,
so it costs no round trip and expires, is renewed and is deleted with the lock.
The owner id, a credential, is never part of it. ``acquired_at`` is the
server's clock at the grant.

Upper layers add what only they know with :func:`holder_details` (Celery's task
id and name); it follows the current thread or asyncio task (a context variable).
A ``role`` detail says what the hold is for: an elected leader's lock
(:mod:`django_rlock.core._sync.leader`) reads ``"MainThread (leader)"`` as its thread,
so ``manage.py rlock list`` and the admin show who leads each election.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import socket
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

#: Hash fields beside the owners' hold counts. Owner ids are ``<hex>:<id>``, so
#: a field starting with '~' is never one.
HOLDER_FIELD = "~holder"


SINCE_FIELD = "~since"


#: What an operator is shown of a holder, always all of them (None when unknown).
HOLDER_KEYS = ("host", "pid", "thread", "task_id", "task_name", "acquired_at")


_details: ContextVar[Mapping[str, str] | None] = ContextVar("rlock_holder_details", default=None)


_HOST = socket.gethostname()


@contextmanager
def holder_details(**details: str) -> Iterator[None]:
    """Add ``details`` (``task_id=``, ``task_name=``, ``role=``) to the locks taken in the block."""
    token = _details.set({**(_details.get() or {}), **details})
    try:
        yield
    finally:
        _details.reset(token)


def describe() -> str:
    """The caller's description, as a new grant stores it (JSON).

    Every acquire sends it, so the common case costs a few attribute reads: a
    thread outside any event loop with no :func:`holder_details` gets the
    description its thread last got, made again only when its name or the
    process changed.
    """
    if asyncio._get_running_loop() is None and _details.get() is None:
        name = threading.current_thread().name
        made = getattr(_made, "plain", None)
        pid = os.getpid()
        if made is not None and made[0] == name and made[1] == pid:
            return made[2]  # type: ignore[no-any-return]
        description = _encoded(pid, name, "", "", "")
        _made.plain = (name, pid, description)
        return description
    task = _current_task()
    name = task.get_name() if task is not None else threading.current_thread().name
    details = _details.get() or {}
    return _encoded(
        os.getpid(),
        name,
        details.get("task_id", ""),
        details.get("task_name", ""),
        details.get("role", ""),
    )


# Per thread: (thread name, pid, description) of its last plain description.
_made = threading.local()


@functools.lru_cache(maxsize=256)
def _encoded(pid: int, thread: str, task_id: str, task_name: str, role: str) -> str:
    # Cached: a thread takes many locks under one description.
    description = {"host": _HOST, "pid": pid, "thread": thread}
    if task_id:
        description["task_id"] = task_id
    if task_name:
        description["task_name"] = task_name
    if role:
        description["role"] = role
    return json.dumps(description, separators=(",", ":"))


def read_holder(fields: Mapping[str, str]) -> dict[str, Any] | None:
    """The holder a lock hash's fields describe (None when it has no description)."""
    raw = fields.get(HOLDER_FIELD)
    if raw is None:
        return None
    try:
        stored = json.loads(raw)
    except ValueError:
        return None
    holder: dict[str, Any] = {key: stored.get(key) for key in HOLDER_KEYS}
    role = stored.get("role")
    if role:
        # Shown with the thread: the operator's keys stay the documented six.
        holder["thread"] = f"{holder['thread']} ({role})"
    since = fields.get(SINCE_FIELD)
    if since is not None and since.isdigit():
        holder["acquired_at"] = datetime.fromtimestamp(int(since) / 1000, UTC).isoformat()
    return holder


def is_holder_field(field: str) -> bool:
    """Whether a lock hash field is this description rather than an owner's hold count."""
    return field.startswith("~")


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running event loop in this thread
        return None
