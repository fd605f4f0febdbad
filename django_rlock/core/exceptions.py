"""The LockError tree.

Every error a lock raises at run time is a :class:`LockError`. Each concrete
error also inherits the builtin it resembles, so ``except TimeoutError`` keeps
working for callers who do not know this library. Configuration mistakes and
bad input are not lock errors: they raise ``ValueError`` (core) or
``ImproperlyConfigured`` (Django side); a name that cannot be a lock's name
raises :class:`InvalidLockNameError`, a ``ValueError`` of its own, so that a
view can answer it with 400 (it usually comes from a URL).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "DeadlockError",
    "InvalidLockNameError",
    "LockError",
    "LockLostError",
    "LockNotOwnedError",
    "LockNotReplicatedError",
    "LockOrderWarning",
    "LockOutOfMemoryError",
    "LockTimeout",
    "LockUnavailableError",
    "LockUpgradeError",
    "RateLimitExceeded",
]


class InvalidLockNameError(ValueError):
    """A lock name breaks a naming rule (not a str, empty, control characters, too long).

    Not a :class:`LockError`: nothing was asked of the lock server. A name built
    from request input (``rlock(f"page:{slug}")``, ``@locked("page:{slug}")``)
    that fails here is the client's mistake: ``LockErrorMiddleware`` and
    ``@locked`` views answer it with ``400 Bad Request``. The message names
    the rule (and the name: keep it out of responses).
    """


class LockError(Exception):
    """Base class of every run-time lock error; ``name`` is the lock's name.

    Every one pickles as itself, with its attributes: Celery stores a task's
    exception pickled, and replaces one that does not round-trip by its first
    base class that does (a LockUnavailableError, whose ``server`` is a
    required keyword, was stored and logged as a plain LockError).
    """

    def __init__(self, message: str, *, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name

    def __reduce__(self) -> tuple[Any, ...]:
        # BaseException's own rebuilds with cls(*args), which the required
        # keywords of the subclasses (server=, required=, ...) refuse.
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(cls: type[LockError], args: tuple[Any, ...], state: dict[str, Any]) -> LockError:
    """Unpickle a LockError: its args and attributes back, without calling ``__init__``."""
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class LockTimeout(LockError, TimeoutError):
    """The lock stayed busy for the whole wait.

    ``retry_after`` is the holder's remaining lease in seconds when known (what
    an HTTP ``Retry-After`` header or a task countdown should use), else None.
    """

    def __init__(
        self, message: str, *, name: str | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message, name=name)
        self.retry_after = retry_after


class RateLimitExceeded(LockTimeout):
    """A rate limit refused the call: its permit is not due yet. Nothing was taken.

    ``retry_after`` is the exact seconds until the permit is due. A view's
    ``LockErrorMiddleware`` answers it ``429 Too Many Requests`` (a plain
    :class:`LockTimeout` is a busy lock: 409).
    """


class LockNotOwnedError(LockError):
    """The caller released (or extended) a lock it does not hold. Nothing was changed."""


class LockLostError(LockNotOwnedError):
    """The caller held the lock, but it expired or was taken over before release."""


class LockUnavailableError(LockError, ConnectionError):
    """The lock server could not be reached, or did not answer in time.

    Raised instead of redis-py's connection and timeout errors by every lock
    call (acquire, release, inspection). ``server`` names the server as the
    message does: the Django alias, or the URL without its credentials. Whether
    a call whose reply never came ran on the server is unknown; retrying it is
    safe (see docs/failure-modes.md). ``server`` is None only for an error
    rebuilt from its message alone (Celery's JSON result backend does that).
    """

    def __init__(self, message: str, *, name: str | None = None, server: str | None = None) -> None:
        super().__init__(message, name=name)
        self.server = server


class LockNotReplicatedError(LockError):
    """Redis granted the lock, but too few replicas confirmed it in time (``min_replicas``).

    The grant was undone before this was raised, so nothing is held: a
    failover to a replica that never saw the grant cannot hand the same lock
    to a second owner. ``required`` and ``acknowledged`` count replicas.
    """

    def __init__(
        self, message: str, *, name: str | None = None, required: int, acknowledged: int
    ) -> None:
        super().__init__(message, name=name)
        self.required = required
        self.acknowledged = acknowledged


class LockOutOfMemoryError(LockError):
    """Redis refused the acquire because it is out of memory (OOM, ``maxmemory`` reached).

    Nothing was granted or changed. Releases and renewals of locks already
    held still succeed on Redis >= 7 (their scripts may run under OOM), so a
    full server stops new grants without stranding the holders.
    """


class DeadlockError(LockError):
    """The caller's wait closed a cycle of waiters (a deadlock): its acquire gave up.

    Like a database's "deadlock detected": each member of the cycle holds a
    lock the next one waits for, so none could ever go on. Exactly one member
    of a cycle gets this error (the one whose acquire call began last); the
    others keep waiting and get their locks once this caller releases what it
    holds. Nothing was granted by the failed acquire: release the locks you
    hold (leave the ``with`` blocks) and retry, or take locks in one global
    order so that no cycle can form.

    ``name`` is the lock the caller waited for; ``cycle`` lists the cycle from
    there, one entry per lock: ``{"lock": name, "kind": kind, "holder": {"host",
    "pid", "thread", "task_id", "task_name", "acquired_at"}}`` (``kind``:
    ``"lock"``, ``"fair_lock"``, ``"read_write_lock"`` or ``"semaphore"``; the
    holder as stored with the grant, None when unknown, as for a reader). The
    caller's own hold closes the list.
    ``retry_after`` is None from the engine; the Django and Celery faces set it
    to the seconds after which a retry is likely to find the lock free (how
    long it is really held), as :class:`LockTimeout` carries it, for the
    ``Retry-After`` of a view or the countdown of a task's retry.
    """

    def __init__(
        self,
        message: str,
        *,
        name: str | None = None,
        cycle: tuple[dict[str, Any], ...] = (),
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, name=name)
        self.cycle = cycle
        self.retry_after = retry_after


class LockUpgradeError(LockError):
    """A thread (or task) holding a read lock asked for the write lock of the same name.

    Raised at once, changing nothing: waiting could never end, since the
    caller's own read hold keeps the write lock from it. Release every read
    hold first (or take the write lock first: the writer may also read).
    """


class LockOrderWarning(RuntimeWarning):
    """Locks were taken in an order opposite to one seen before: a deadlock waiting to happen.

    Issued by the lock order check (``LockClient(lock_order_check=True)``,
    ``RLOCK_LOCK_ORDER_CHECK = True``; see docs/deadlocks.md) the first time
    an owner closes a cycle of lock orders in this process: it took ``B``
    while holding ``A`` where ``A`` was once taken while holding ``B`` (or
    a longer cycle), whether or not a deadlock happened. Not a
    :class:`LockError`: nothing failed, and the lock was granted.
    A RuntimeWarning, as Django's own run-time traps are; attributed to the
    call site that took the inverted order. ``-W
    error::django_rlock.LockOrderWarning`` (or pytest's ``filterwarnings``)
    makes the pytest plugin fail the test that took it.

    ``cycle`` lists the cycle's edges, the one just seen first, each with
    ``held``, ``taken`` (lock classes: key templates such as
    ``"order:{order_id}"``, else names) and ``held_at``, ``taken_at`` (the
    call sites, ``filename``, ``lineno``, ``function``).
    """

    def __init__(self, message: str, *, cycle: tuple[Any, ...] = ()) -> None:
        super().__init__(message)
        self.cycle = cycle
