"""Redis unreachable: the one translation of redis-py's connection errors.

Every public lock call, in the sync and the asyncio engine alike, runs inside
:func:`reported_unavailable`, so a caller sees
:class:`~django_rlock.core.exceptions.LockUnavailableError` naming the lock
and the server, never a bare redis-py error::

    with reported_unavailable(client.server, "acquire", lock.name):
        ...  # redis calls

The translation happens at the public boundary only: inside it the engine
still sees redis-py's own errors, on which its resend and unanswered-request
rules depend. The watchdog never goes through it: a failed renewal is retried
until the hold's deadline, then reported as a lost lock.

A Redis Cluster whose slot is moving (a reshard, a failover) counts as
unreachable for that slot: :data:`SLOT_MOVING` and :func:`refused_for_slot`
say which refusals mean so. Acquire and release resend such a call while the
slot settles (:func:`django_rlock.core._sync.sharding.resend_while_settling`);
what is still refused after that is reported here like any unreachable server.
"""

from __future__ import annotations

from types import TracebackType
from typing import Final

import redis.exceptions as redis_errors

from django_rlock.core.exceptions import LockUnavailableError

#: redis-py's ways of saying a cluster cannot serve the slot now, so the call
#: was not run there: the cluster is down or has no primary for the slot
#: (``ClusterDownError``, a ``ClusterError``), redis-py followed redirections
#: and TRYAGAIN replies until its own tries ran out (``ClusterError: TTL
#: exhausted.``), a redirection or TRYAGAIN reached the caller (on a node's own
#: connection, as the replica-synced acquire uses: ``AskError``, ``MovedError``,
#: ``TryAgainError``), or its map has no node for the slot (``SlotNotCoveredError``,
#: not even a ``RedisError``).
SLOT_MOVING: Final = (
    redis_errors.ClusterError,
    redis_errors.TryAgainError,
    redis_errors.AskError,
    redis_errors.SlotNotCoveredError,
)

#: redis-py's ways of saying the server cannot be used now: refused, reset or
#: timed-out connections (AUTH failures and a server still loading included),
#: and a cluster that cannot serve the slot (:data:`SLOT_MOVING`).
UNREACHABLE: Final = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    *SLOT_MOVING,
)

#: How Redis refuses a key inside a script whose slot is moving (the script
#: was let in, then its first access to the key was redirected): a plain error
#: reply, so a ``ResponseError`` that only its words tell apart.
_NON_LOCAL_KEY = "Script attempted to access a non local key in a cluster node"


def refused_for_slot(error: BaseException) -> bool:
    """Whether ``error`` is a cluster refusing a call because the slot is moving.

    The :data:`SLOT_MOVING` errors, and a script's access to a key the node
    does not serve now (Redis 7.0 refuses a key of a slot being imported even
    to a script it let in by ASKING).
    """
    if isinstance(error, SLOT_MOVING):
        return True
    return isinstance(error, redis_errors.ResponseError) and _NON_LOCAL_KEY in str(error)


def unavailable_error(
    server: str, action: str, name: str | None, error: BaseException
) -> LockUnavailableError:
    """The error for ``action`` on lock ``name`` (None: no single lock) failing with ``error``."""
    what = f"{action} lock {name!r}" if name is not None else action
    state = (
        "cannot serve the lock's slot now (a reshard or failover that did not settle in time)"
        if refused_for_slot(error)
        else "is unreachable"
    )
    return LockUnavailableError(
        f"cannot {what}: the lock server {server} {state} ({type(error).__name__}: {error})",
        name=name,
        server=server,
    )


class reported_unavailable:
    """Turn redis-py's :data:`UNREACHABLE` errors inside the block into LockUnavailableError.

    So is a script's key refused for a moving slot (:func:`refused_for_slot`).

    A plain ``with`` works around ``await`` too, so the asyncio engine uses it as is.
    A class rather than a ``@contextmanager``: every lock call enters one, and a
    generator-based context costs several times as much.
    """

    __slots__ = ("action", "name", "server")

    def __init__(self, server: str, action: str, name: str | None = None) -> None:
        self.server, self.action, self.name = server, action, name

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if error is not None and (isinstance(error, UNREACHABLE) or refused_for_slot(error)):
            raise unavailable_error(self.server, self.action, self.name, error) from error
