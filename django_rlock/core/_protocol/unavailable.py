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
"""

from __future__ import annotations

from types import TracebackType
from typing import Final

import redis.exceptions as redis_errors

from django_rlock.core.exceptions import LockUnavailableError

#: redis-py's ways of saying the server cannot be used now: refused, reset or
#: timed-out connections (AUTH failures and a server still loading included),
#: and a cluster without a primary for the slot.
UNREACHABLE: Final = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.ClusterDownError,
)


def unavailable_error(
    server: str, action: str, name: str | None, error: BaseException
) -> LockUnavailableError:
    """The error for ``action`` on lock ``name`` (None: no single lock) failing with ``error``."""
    what = f"{action} lock {name!r}" if name is not None else action
    return LockUnavailableError(
        f"cannot {what}: the lock server {server} is unreachable ({type(error).__name__}: {error})",
        name=name,
        server=server,
    )


class reported_unavailable:
    """Turn redis-py's :data:`UNREACHABLE` errors inside the block into LockUnavailableError.

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
        if error is not None and isinstance(error, UNREACHABLE):
            raise unavailable_error(self.server, self.action, self.name, error) from error
