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
import math
import os
import socket
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from django_rlock.core._process import forking

#: Hash fields beside the owners' hold counts. Owner ids are ``<hex>:<id>``, so
#: a field starting with '~' is never one.
HOLDER_FIELD = "~holder"


SINCE_FIELD = "~since"


#: What an operator is shown of a holder, always all of them (None when unknown).
HOLDER_KEYS = ("host", "pid", "thread", "task_id", "task_name", "acquired_at")

#: The description's key for a grant's fixed lease, in seconds (absent: the
#: watchdog renews the hold): what a busy caller is told ends, and when.
LEASE_KEY = "lease"


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


def describe(lease: float | None = None) -> str:
    """The caller's description, as a new grant stores it (JSON).

    ``lease``: the grant's fixed lease in seconds, recorded so that a busy
    caller is told the truth (a lease ends; a watchdog hold lasts until its
    holder releases it or dies). Every acquire sends it, so the common case
    costs a few attribute reads: a thread outside any event loop with no
    :func:`holder_details` gets the description its thread last got, made
    again only when its name changed, or in a forked child (whose one thread
    forgets it: the pid changed).
    """
    if lease is not None:
        return _leased(describe(), lease)
    if asyncio._get_running_loop() is None and _details.get() is None:
        name = threading.current_thread().name
        made = getattr(_made, "plain", None)
        if made is not None and made[0] == name:
            return made[1]  # type: ignore[no-any-return]
        description = _encoded(os.getpid(), name, "", "", "")
        _made.plain = (name, description)
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


# Per thread: (thread name, description) of its last plain description, made
# in this process (getpid is a system call: not asked on every acquire).
_made = threading.local()


@forking.after_fork_in_child
def _forget_descriptions() -> None:
    # The child's one thread, the one that forked, described itself with its parent's pid.
    _made.plain = None


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


@functools.lru_cache(maxsize=256)
def _leased(description: str, lease: float) -> str:
    # The description is a JSON object made by _encoded: one more key at its end.
    return f'{description[:-1]},"{LEASE_KEY}":{json.dumps(lease)}}}'


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


def holder_line(holder: Mapping[str, Any] | None) -> str:
    """A holder as every operator view and message shows it, in one line.

    ``web-1 pid 12 thread 'Thread-3'``, and its Celery task when it has one
    (``task shop.charge[5f2...]``); ``holder`` is what :func:`read_holder` read.
    The admin, ``manage.py rlock list`` and ``inspect``, and the errors that name
    a holder all use it, so an operator finds the same words everywhere.
    """
    if not holder:
        return "an unknown holder"
    text = f"{holder.get('host')} pid {holder.get('pid')} thread {holder.get('thread')!r}"
    if holder.get("task_name") or holder.get("task_id"):
        text += f" task {holder.get('task_name') or '?'}[{holder.get('task_id') or '?'}]"
    return text


def read_hold(description: bytes | str | None, since: bytes | str | None) -> dict[str, Any] | None:
    """A hold's ``~holder`` and ``~since`` fields, as a client read them, as a dict.

    The operator's keys (:data:`HOLDER_KEYS`) and ``lease``: the grant's fixed
    lease in seconds, None for a hold the watchdog renews until it is released.
    None when the hold has no description.
    """
    raw = stored_description(description)
    if raw is None:
        return None
    fields = {HOLDER_FIELD: raw}
    since_text = stored_description(since)
    if since_text is not None:
        fields[SINCE_FIELD] = since_text
    holder = read_holder(fields)
    if holder is None:
        return None
    stored = json.loads(raw)  # read_holder parsed it: valid
    lease = stored.get(LEASE_KEY) if isinstance(stored, dict) else None
    holder[LEASE_KEY] = float(lease) if isinstance(lease, int | float) else None
    return holder


def busy_reason(holder: Mapping[str, Any] | None, remaining: float | None) -> str:
    """Who holds a busy lock and when it may be free, as the grant recorded it.

    ``holder``: what :func:`read_hold` read, None when the grant wrote no
    description; ``remaining``: the key's seconds left (inf: no expiry), None
    when it is free by now. A watchdog hold's key is renewed for as long as its
    holder runs, so its TTL is only when it would free the lock were the holder
    to die; a lease really ends then.
    """
    if remaining is None:
        return "it was released meanwhile"
    if math.isinf(remaining):
        return "its key has no expiry (set by hand?): it stays until force-released"
    if holder is None:
        return f"its key expires in {remaining:.3f}s unless its holder renews it"
    who = holder_line(holder)
    lease = holder.get(LEASE_KEY)
    if lease is not None:
        return f"held by {who}, whose {lease:g}s lease ends in {remaining:.3f}s"
    return (
        f"held by {who}, whose watchdog renews it until it is released "
        f"(were that process to die, it would be free within {remaining:.3f}s)"
    )


def stored_description(raw: bytes | str | None) -> str | None:
    """A ``~holder`` field as a client read it (bytes or text), as text; None when absent."""
    if isinstance(raw, bytes):
        return raw.decode("utf-8", "replace")
    return raw


def is_holder_field(field: str) -> bool:
    """Whether a lock hash field is this description rather than an owner's hold count."""
    return field.startswith("~")


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running event loop in this thread
        return None
