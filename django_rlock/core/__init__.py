"""The Django-free engine: Redisson's RLock on Redis.

Importable and usable with no Django settings::

    from django_rlock.core import LockClient

    client = LockClient("redis://127.0.0.1:6379/0", key_prefix="shop")
    with client.lock("order:42"):
        ...
"""

from django_rlock.core.client import LockClient
from django_rlock.core.exceptions import (
    LockError,
    LockLostError,
    LockNotOwnedError,
    LockNotReplicatedError,
    LockOutOfMemoryError,
    LockTimeout,
    LockUnavailableError,
)
from django_rlock.core.lock import RLock
from django_rlock.core.multilock import MultiLock, RedLock

__all__ = [
    "LockClient",
    "LockError",
    "LockLostError",
    "LockNotOwnedError",
    "LockNotReplicatedError",
    "LockOutOfMemoryError",
    "LockTimeout",
    "LockUnavailableError",
    "MultiLock",
    "RLock",
    "RedLock",
]
