"""The LockError tree.

Every error a lock raises at run time is a :class:`LockError`. Each concrete
error also inherits the builtin it resembles, so ``except TimeoutError`` keeps
working for callers who do not know this library. Configuration mistakes are
not lock errors: they raise ``ValueError`` (core) or ``ImproperlyConfigured``
(Django side).
"""

from __future__ import annotations

__all__ = ["LockError", "LockLostError", "LockNotOwnedError", "LockTimeout"]


class LockError(Exception):
    """Base class of every run-time lock error; ``name`` is the lock's name."""

    def __init__(self, message: str, *, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name


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


class LockNotOwnedError(LockError):
    """The caller released (or extended) a lock it does not hold. Nothing was changed."""


class LockLostError(LockNotOwnedError):
    """The caller held the lock, but it expired or was taken over before release."""
