"""The errors of the Django face.

Run-time lock errors live in the core (every one a :class:`LockError`) and are
re-exported here, with the core's :class:`InvalidLockNameError` (a
``ValueError``: a name that cannot be a lock's). Configuration mistakes are
not lock errors: they raise :class:`LockSettingError`, an
``ImproperlyConfigured``, whose ``check_id`` names the system check that
reports the same mistake at start-up.

Importing this module needs Django installed but no settings configured.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from django_rlock.core.exceptions import (
    DeadlockError,
    InvalidLockNameError,
    LockError,
    LockLostError,
    LockNotOwnedError,
    LockNotReplicatedError,
    LockOrderWarning,
    LockOutOfMemoryError,
    LockTimeout,
    LockUnavailableError,
    LockUpgradeError,
    RateLimitExceeded,
)

__all__ = [
    "DeadlockError",
    "InvalidLockBackendError",
    "InvalidLockNameError",
    "LockError",
    "LockLostError",
    "LockNotOwnedError",
    "LockNotReplicatedError",
    "LockOrderWarning",
    "LockOutOfMemoryError",
    "LockSettingError",
    "LockTimeout",
    "LockUnavailableError",
    "LockUpgradeError",
    "RateLimitExceeded",
]


class LockSettingError(ImproperlyConfigured):
    """A lock setting cannot work; ``check_id`` is the system check that reports it."""

    default_check_id = "django_rlock.E001"

    def __init__(self, message: str, *, check_id: str | None = None) -> None:
        super().__init__(message)
        self.check_id = check_id or self.default_check_id


class InvalidLockBackendError(LockSettingError):
    """An unknown lock alias, or a BACKEND that cannot be imported or used."""

    default_check_id = "django_rlock.E002"
