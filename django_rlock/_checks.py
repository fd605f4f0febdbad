"""System checks of the lock settings (``manage.py check``), registered by the app.

=====================  ========================================================
``django_rlock.E001``  ``RLOCKS`` is not a dict of dicts, or has no ``default``.
``django_rlock.E002``  An alias's ``BACKEND`` cannot be imported or is not a
                       lock backend (or its optional dependency is missing).
``django_rlock.E003``  An alias's ``LOCATION``, ``CACHE`` or ``OPTIONS`` cannot
                       work (not a redis URL, both LOCATION and CACHE, a cache
                       alias that is not a Django Redis cache...).
``django_rlock.E004``  ``WATCHDOG_TIMEOUT`` is not a positive number, or
                       ``SLOW_WAIT``/``SLOW_HOLD`` is neither None nor >= 0.
``django_rlock.E005``  ``KEY_PREFIX`` is unusable (contains ``{`` or ``}``).
``django_rlock.E006``  ``BUSY_RESPONSE`` is not a status, ``"raise"`` or a callable.
``django_rlock.E007``  An alias, or its ``OPTIONS``, has a key nothing reads (a
                       typo such as ``LOCATON`` would otherwise be ignored); or
                       a setting nothing reads is named like one: an unknown
                       ``RLOCK_*`` global (``RLOCK_WATCHDOG_TIMOUT``), or a dict
                       spelt like ``RLOCKS`` (``RLOCK``, ``RLOCS``).
``django_rlock.E008``  ``RLOCK_METRICS`` is neither None nor ``"prometheus"``,
                       or prometheus_client is not installed.
``django_rlock.E009``  ``TRANSACTION`` is not ``"auto"``/``"ignore"``, or
                       ``LEAKED`` not ``"release"``/``"warn"``.
``django_rlock.E010``  ``LAYOUT`` is not ``"rlock"``/``"redisson"``,
                       ``SHARDED_SUBSCRIPTION`` not ``"auto"``/``"on"``/``"off"``,
                       or ``"redisson"`` is combined with ``CACHE`` or ``MIN_REPLICAS``.
``django_rlock.W001``  The LocMem backend is used with ``DEBUG = False``: it
                       does not lock across processes.
``django_rlock.W003``  (deploy) Redis's ``maxmemory-policy`` can evict keys with
                       a TTL: held locks would vanish silently under memory
                       pressure. Use ``noeviction``.
``django_rlock.W004``  (deploy) The ``maxmemory-policy`` could not be read.
``django_rlock.W005``  A database has ``ATOMIC_REQUESTS = True`` while an alias's
                       ``TRANSACTION`` is ``"ignore"``: a locked view's lock is
                       then released before its transaction commits.
=====================  ========================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

from django_rlock import _conf as conf
from django_rlock._handler import create_backend, locks
from django_rlock.backends.locmem import LocMemLockBackend
from django_rlock.exceptions import LockSettingError

TAG = "django_rlock"


@register(TAG)
def check_lock_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """Every RLOCKS alias can be built, and its values make sense."""
    try:
        configured = conf.lock_settings()
    except LockSettingError as error:
        return [Error(str(error), id=error.check_id)]
    messages: list[CheckMessage] = []
    try:
        conf.metrics()
    except LockSettingError as error:
        messages.append(Error(str(error), id=error.check_id))
    for alias, params in configured.items():
        where = f"RLOCKS[{alias!r}]"
        try:
            conf.busy_response(alias)
        except LockSettingError as error:
            messages.append(Error(str(error), id=error.check_id))
        try:
            backend = create_backend(alias, params)
        except LockSettingError as error:
            message = Error(str(error), id=error.check_id)
            if message not in messages:  # a process-wide setting fails every alias alike
                messages.append(message)
        else:
            if isinstance(backend, LocMemLockBackend) and not settings.DEBUG:
                messages.append(
                    Warning(
                        f"{where} uses the LocMem lock backend with DEBUG = False: its locks "
                        "hold only inside one process, not across workers or servers.",
                        hint="Use django_rlock.backends.redis.RedisLockBackend in production.",
                        id="django_rlock.W001",
                    )
                )
    return messages


@register(TAG)
def check_setting_names(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """No setting named like django-rlock's is left unread (a typo falls back to a default)."""
    return [
        Error(
            message,
            hint="Correct the name (a setting of your own needs a name not starting "
            "with RLOCK_ nor spelt like RLOCKS).",
            id="django_rlock.E007",
        )
        for message in conf.misspelt_settings()
    ]


@register(TAG, deploy=True)
def check_eviction_policy(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """Redis must not evict lock keys: each alias's ``maxmemory-policy`` is ``noeviction``."""
    try:
        aliases = conf.aliases()
    except LockSettingError:
        return []  # reported by check_lock_settings
    messages: list[CheckMessage] = []
    for alias in aliases:
        try:
            policy = locks[alias].maxmemory_policy()
        except LockSettingError:
            continue  # reported by check_lock_settings
        except redis.RedisError as error:
            messages.append(
                Warning(
                    f"RLOCKS[{alias!r}]: could not read Redis's maxmemory-policy: "
                    f"{type(error).__name__}: {error}",
                    hint="Make sure the server's maxmemory-policy is noeviction.",
                    id="django_rlock.W004",
                )
            )
            continue
        if policy is not None and policy != "noeviction":
            messages.append(
                Warning(
                    f"RLOCKS[{alias!r}]: Redis's maxmemory-policy is {policy!r}, which can "
                    "evict keys with a TTL: under memory pressure held locks would vanish "
                    "and two owners could hold one lock.",
                    hint="Set maxmemory-policy to noeviction on the lock server "
                    "(or give locks a Redis of their own).",
                    id="django_rlock.W003",
                )
            )
    return messages


@register(TAG)
def check_transaction_binding(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """``ATOMIC_REQUESTS`` with ``TRANSACTION = "ignore"``: locks end before the commit."""
    atomic = [alias for alias, db in settings.DATABASES.items() if db.get("ATOMIC_REQUESTS")]
    if not atomic:
        return []
    try:
        ignoring = [alias for alias in conf.aliases() if conf.transaction(alias) == "ignore"]
    except LockSettingError:
        return []  # reported by check_lock_settings
    if not ignoring:
        return []
    return [
        Warning(
            f"DATABASES {', '.join(map(repr, atomic))} set ATOMIC_REQUESTS = True while the "
            f"lock alias(es) {', '.join(map(repr, ignoring))} release at the end of the "
            "locked block (TRANSACTION = 'ignore'): a locked view's lock is then free before "
            "its transaction commits, and the next holder reads the old rows (lost updates).",
            hint="Remove RLOCK_TRANSACTION = 'ignore' (the default 'auto' keeps the lock "
            "until the commit), or pass transaction='ignore' only where that is intended.",
            id="django_rlock.W005",
        )
    ]
