"""The Django-free engine: Redisson's RLock on Redis.

Importable and usable with no Django settings::

    from django_rlock.core import LockClient

    client = LockClient("redis://127.0.0.1:6379/0", key_prefix="shop")
    with client.lock("order:42"):
        ...

The public names are this package's ``__all__``, :mod:`~django_rlock.core.aio`
(the asyncio twin), :mod:`~django_rlock.core.exceptions` and
:mod:`~django_rlock.core.defaults` (every default and the renewal timing).

The other modules are the engine's internals: importable, and used by the
Django and Celery faces, but not a contract. They stand on three floors
(``docs/engine.md``, "Where the code is", maps every module):

- ``_process/``: what one process keeps (``identity``, ``forking``, ``holder``,
  ``scopes``, ``leaks``, ``lostholds``, ``telling``, ``lockorder``);
- ``_protocol/``: the lock protocol without I/O (``names``, ``lua``, ``calls``,
  ``resp``, ``plan``, ``holds``, ``channels``, ``deadlocks``), one module per
  kind with its scripts and bookkeeping (``lock`` and ``lockbase``,
  ``fairlock``, ``rwlock``, ``semaphore``, ``redisson``, ``leader``,
  ``ratelimit``);
- ``_sync/`` and ``_aio/``, side by side with the same file names: the threaded
  and asyncio shells of each kind (``locks``, ``fairlock``, ``rwlock``,
  ``semaphore``, ``redisson``, ``leader``, ``ratelimiter``), each engine's
  ``client``, ``waiting`` and ``wire``; the threaded ``watchdog`` renews the
  holds of both.
"""

from django_rlock.core._protocol.leader import Term
from django_rlock.core._sync.client import LockClient
from django_rlock.core._sync.fairlock import FairLock
from django_rlock.core._sync.leader import Leadership
from django_rlock.core._sync.locks import RLock
from django_rlock.core._sync.multilock import MultiLock, RedLock
from django_rlock.core._sync.ratelimiter import RateLimiter
from django_rlock.core._sync.rwlock import ReadLock, ReadWriteLock, WriteLock
from django_rlock.core._sync.semaphore import Semaphore
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
    "FairLock",
    "InvalidLockNameError",
    "Leadership",
    "LockClient",
    "LockError",
    "LockLostError",
    "LockNotOwnedError",
    "LockNotReplicatedError",
    "LockOrderWarning",
    "LockOutOfMemoryError",
    "LockTimeout",
    "LockUnavailableError",
    "LockUpgradeError",
    "MultiLock",
    "RLock",
    "RateLimitExceeded",
    "RateLimiter",
    "ReadLock",
    "ReadWriteLock",
    "RedLock",
    "Semaphore",
    "Term",
    "WriteLock",
]
