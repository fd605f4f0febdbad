"""django-rlock: Redisson-grade distributed locks for Django and Celery, on Redis.

::

    from django_rlock import locked, locks, rlock

    with rlock(f"order:{order_id}", timeout=5):     # RLOCKS["default"]
        ...

    @locked("order:{order_id}", timeout=0)          # 409 + Retry-After when busy
    def pay(request, order_id): ...

Every error a caller may catch is importable from here (and from
:mod:`django_rlock.exceptions`): the run-time ``LockError`` tree of the core
and the configuration errors (``LockSettingError``, an ``ImproperlyConfigured``).

The Django names are loaded on first use, so ``import django_rlock.core`` (the
Django-free engine) works with no Django settings configured.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django_rlock._handler import MissingAppWarning, locks
    from django_rlock._keys import UnformattedNameWarning
    from django_rlock._web.decorators import locked
    from django_rlock._web.leader import leader
    from django_rlock._web.ratelimited import rate_limited
    from django_rlock._web.shortcuts import rlock, semaphore
    from django_rlock.exceptions import (
        DeadlockError,
        InvalidLockBackendError,
        InvalidLockNameError,
        LockError,
        LockLostError,
        LockNotOwnedError,
        LockNotReplicatedError,
        LockOrderWarning,
        LockOutOfMemoryError,
        LockSettingError,
        LockTimeout,
        LockUnavailableError,
        LockUpgradeError,
        RateLimitExceeded,
    )

__version__ = "0.1.0"

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
    "MissingAppWarning",
    "RateLimitExceeded",
    "UnformattedNameWarning",
    "leader",
    "locked",
    "locks",
    "rate_limited",
    "rlock",
    "semaphore",
]

_LAZY = {
    "DeadlockError": "django_rlock.exceptions",
    "InvalidLockBackendError": "django_rlock.exceptions",
    "InvalidLockNameError": "django_rlock.exceptions",
    "LockError": "django_rlock.exceptions",
    "LockLostError": "django_rlock.exceptions",
    "LockNotOwnedError": "django_rlock.exceptions",
    "LockNotReplicatedError": "django_rlock.exceptions",
    "LockOrderWarning": "django_rlock.exceptions",
    "LockOutOfMemoryError": "django_rlock.exceptions",
    "LockSettingError": "django_rlock.exceptions",
    "LockTimeout": "django_rlock.exceptions",
    "LockUnavailableError": "django_rlock.exceptions",
    "LockUpgradeError": "django_rlock.exceptions",
    "MissingAppWarning": "django_rlock._handler",
    "RateLimitExceeded": "django_rlock.exceptions",
    "UnformattedNameWarning": "django_rlock._keys",
    "leader": "django_rlock._web.leader",
    "locked": "django_rlock._web.decorators",
    "locks": "django_rlock._handler",
    "rate_limited": "django_rlock._web.ratelimited",
    "rlock": "django_rlock._web.shortcuts",
    "semaphore": "django_rlock._web.shortcuts",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_rlock' has no attribute {name!r}")
    from importlib import import_module  # noqa: PLC0415 -- loaded with the name

    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


def _wire_celery() -> None:
    # A Celery app that uses the locks (the engine alone, or the Django face,
    # with or without celery_rlock) has imported Celery before them: each task
    # run is a scope whose holds end with it (django_rlock._scopes.taskruns). The Django
    # app wires it too, for a project that imports Celery later.
    import sys  # noqa: PLC0415

    if "celery" in sys.modules:
        from django_rlock._scopes import taskruns  # noqa: PLC0415 -- only where Celery is

        taskruns.wire_task_runs()


_wire_celery()
