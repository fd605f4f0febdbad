"""The lock errors, importable from the Django face (they live in the core)."""

from django_rlock.core.exceptions import LockError, LockLostError, LockNotOwnedError, LockTimeout

__all__ = ["LockError", "LockLostError", "LockNotOwnedError", "LockTimeout"]
