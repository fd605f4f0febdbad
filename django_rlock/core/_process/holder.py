"""Who holds a lock, as an operator sees it: host, pid, thread or task, Celery task.

A new grant writes this beside the owner's hold count, in the lock's own hash
(fields :data:`HOLDER_FIELD`, :data:`TASK_FIELD` and :data:`SINCE_FIELD`), in
the same script call, so it costs no round trip and expires, is renewed and is
deleted with the lock. The owner id, a credential, is never part of it.
``acquired_at`` is the server's clock at the grant.

The description is compact, every stored value at most :data:`MAX_VALUE_BYTES`
(Redis's default ``hash-max-listpack-value``): a hash whose values all fit stays
a listpack (~216 B for a held lock), one longer value turns it into a hash
table for as long as it lives (~550 B). The client sends one string (the
scripts' arguments are unchanged), its process part, then :data:`TASK_MARK`
and its task part when a Celery task holds it; the script stores the first as
``~holder`` and the second as ``~task``. The process part is host, pid, thread,
role and lease, the task part task id and task name, each part's values apart
by :data:`VALUE_MARK` (a task id that is a UUID is stored as its 32 hex digits,
after :data:`UUID_MARK` instead). Names too long to fit are cut, by characters
(UTF-8 stays valid), ending in :data:`CUT_MARK`. The control characters these
marks are made of never reach a stored name (each becomes '?'). A description
of the previous releases (one JSON object in ``~holder``) is still read.

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
import re
import socket
import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, cast

from django_rlock.core._process import forking

#: Hash fields beside the owners' hold counts. Owner ids are ``<hex>:<id>``, so
#: a field starting with '~' is never one.
HOLDER_FIELD = "~holder"


SINCE_FIELD = "~since"

#: The hash field of the Celery task holding the lock (absent when none does).
TASK_FIELD = "~task"

#: Every field a grant's description may write, as a client reads them back.
DESCRIPTION_FIELDS = (HOLDER_FIELD, SINCE_FIELD, TASK_FIELD)

#: The most bytes any stored part of a description takes (Redis's default
#: ``hash-max-listpack-value``: one value longer and the hash costs 2.5x).
MAX_VALUE_BYTES = 64

#: Between the process part and the task part of a sent description (the script splits there).
TASK_MARK = "\x1f"

#: Between the values of one part.
VALUE_MARK = "\x1e"

#: Between a task id stored as its UUID's 32 hex digits and the task name.
UUID_MARK = "\x1d"

#: Ends a name cut to fit.
CUT_MARK = "\u2026"

# What a stored name never contains: the marks (and its neighbour, kept free).
_UNSAFE = str.maketrans(dict.fromkeys((0x1C, 0x1D, 0x1E, 0x1F), "?"))
_MARKS = re.compile("[\x1c-\x1f]")

# A task id stored as its 32 hex digits: a UUID in its canonical form, nothing else.
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


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
    if asyncio._get_running_loop() is None and _details.get() is None:
        name = threading.current_thread().name
        made = getattr(_made, "plain", None)
        if made is None or made[0] != name:
            pid = os.getpid()
            made = _made.plain = (name, _encoded(pid, name, "", "", ""), pid)
        if lease is None:
            return made[1]
        return _encoded(made[2], name, "", "", "", lease)
    task = _current_task()
    name = task.get_name() if task is not None else threading.current_thread().name
    details = _details.get() or {}
    return _encoded(
        os.getpid(),
        name,
        details.get("task_id", ""),
        details.get("task_name", ""),
        details.get("role", ""),
        lease,
    )


# Per thread: (thread name, description, pid) of its last plain description, made
# in this process (getpid is a system call: not asked on every acquire).
_made = threading.local()


@forking.after_fork_in_child
def _forget_descriptions() -> None:
    # The child's one thread, the one that forked, described itself with its parent's pid.
    _made.plain = None


@functools.lru_cache(maxsize=256)
def _encoded(  # noqa: PLR0917 (cached by its arguments, all positional: lru_cache's fast key)
    pid: int, thread: str, task_id: str, task_name: str, role: str, lease: float | None = None
) -> str:
    # Cached: a thread takes many locks under one description.
    fixed = [str(pid), _fit(_safe(role), 16), "" if lease is None else json.dumps(lease)]
    while fixed and not fixed[-1]:
        fixed.pop()  # trailing empty values are left out: read as absent
    # Host and thread share what the fixed values leave, the shorter one whole if it fits.
    room = MAX_VALUE_BYTES - len(VALUE_MARK.join(["", "", *fixed]).encode())
    host, thread = _share(_safe(_HOST), _safe(thread), room)
    description = VALUE_MARK.join([host, *fixed[:1], thread, *fixed[1:]])
    if not (task_id or task_name):
        return description
    prefix = stored_task_id(task_id)
    # A task name is a dotted path: its end (the task's own name) is kept.
    task = _fit(_safe(task_name), MAX_VALUE_BYTES - len(prefix.encode()), tail=True)
    return f"{description}{TASK_MARK}{prefix}{task}"


def stored_task_id(task_id: str) -> str:
    """How a grant made in ``task_id``'s run begins its ``~task`` field (its id and mark).

    A UUID as Celery makes them is stored as its 32 hex digits (read back as
    it was), any other id as it is. Never cut, whatever its length (a very
    long id then makes its hash a hash table): Celery's duplicate-delivery
    check (``celery_rlock._delivery``) finds a run by this exact prefix.
    """
    safe = _safe(task_id)
    if _UUID.fullmatch(safe):
        return safe.replace("-", "") + UUID_MARK  # 4 bytes left to the name
    return safe + VALUE_MARK


def _safe(text: str) -> str:
    return text.translate(_UNSAFE) if _MARKS.search(text) else text


def _fit(text: str, limit: int, *, tail: bool = False) -> str:
    """``text`` in at most ``limit`` bytes of UTF-8: cut by characters, CUT_MARK where it was cut.

    ``tail``: its end is kept (the mark first), else its start.
    """
    if len(text) * 4 <= limit or len(text.encode()) <= limit:
        return text
    room = limit - len(CUT_MARK.encode())
    if room < 0:
        return ""
    if text.isascii():  # a byte a character
        return CUT_MARK + text[len(text) - room :] if tail else text[:room] + CUT_MARK
    kept = []
    for char in reversed(text) if tail else text:
        room -= len(char.encode())
        if room < 0:
            break
        kept.append(char)
    if tail:
        return CUT_MARK + "".join(reversed(kept))
    return "".join(kept) + CUT_MARK


def _share(first: str, second: str, room: int) -> tuple[str, str]:
    """Both texts in ``room`` bytes together: each keeps at least half, or all it needs."""
    one, two = len(first.encode()), len(second.encode())
    if one + two <= room:
        return first, second
    if one <= room // 2:
        return first, _fit(second, room - one)
    if two <= room // 2:
        return _fit(first, room - two), second
    return _fit(first, room - room // 2), _fit(second, room // 2)


def _parse(process: str, task: str | None) -> dict[str, Any] | None:
    """What a description stored (host, pid, thread, role, lease, task_id, task_name)."""
    if process.startswith("{"):  # the previous releases' form: one JSON object
        try:
            old: object = json.loads(process)
        except ValueError:
            return None
        return cast("dict[str, Any]", old) if isinstance(old, dict) else None
    if task is None and TASK_MARK in process:  # stored whole by a previous release's script
        process, task = process.split(TASK_MARK, 1)
    host, pid, thread, role, lease = [*process.split(VALUE_MARK), "", "", "", ""][:5]
    stored: dict[str, Any] = {"host": host, "thread": thread}
    stored["pid"] = int(pid) if pid.isdigit() else None
    if role:
        stored["role"] = role
    if lease:
        with suppress(ValueError):
            stored[LEASE_KEY] = float(lease)
    if task:
        if UUID_MARK in task:
            task_id, name = task.split(UUID_MARK, 1)
            with suppress(ValueError):
                task_id = str(uuid.UUID(task_id))
        else:
            task_id, name = [*task.split(VALUE_MARK, 1), ""][:2]
        if task_id:
            stored["task_id"] = task_id
        if name:
            stored["task_name"] = name
    return stored


def read_holder(fields: Mapping[str, str]) -> dict[str, Any] | None:
    """The holder a lock hash's fields describe (None when it has no description).

    ``fields``: the hash's fields as text (``~holder``, ``~task``, ``~since``;
    any others are ignored). Reads this release's compact form and the
    previous releases' JSON.
    """
    stored = _stored(fields)
    return None if stored is None else _shown(stored, fields.get(SINCE_FIELD))


def _stored(fields: Mapping[str, str]) -> dict[str, Any] | None:
    raw = fields.get(HOLDER_FIELD)
    return None if raw is None else _parse(raw, fields.get(TASK_FIELD))


def _shown(stored: Mapping[str, Any], since: str | None) -> dict[str, Any]:
    """The operator's keys (:data:`HOLDER_KEYS`) of a parsed description."""
    holder: dict[str, Any] = {key: stored.get(key) for key in HOLDER_KEYS}
    role = stored.get("role")
    if role:
        # Shown with the thread: the operator's keys stay the documented six.
        holder["thread"] = f"{holder['thread']} ({role})"
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


def read_hold(
    description: bytes | str | None,
    since: bytes | str | None,
    task: bytes | str | None = None,
) -> dict[str, Any] | None:
    """A hold's ``~holder``, ``~since`` and ``~task`` fields, as a client read them, as a dict.

    (:data:`DESCRIPTION_FIELDS`, in that order.) The operator's keys
    (:data:`HOLDER_KEYS`) and ``lease``: the grant's fixed lease in seconds,
    None for a hold the watchdog renews until it is released. None when the
    hold has no description.
    """
    fields = {
        field: text
        for field, value in zip(DESCRIPTION_FIELDS, (description, since, task), strict=True)
        if (text := stored_description(value)) is not None
    }
    stored = _stored(fields)
    if stored is None:
        return None
    holder = _shown(stored, fields.get(SINCE_FIELD))
    lease = stored.get(LEASE_KEY)
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
    """A description field as a client read it (bytes or text), as text; None when absent."""
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
