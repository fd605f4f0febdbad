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
``django_rlock.E009``  ``TRANSACTION`` is not ``"auto"``/``"ignore"``,
                       ``LEAKED`` not ``"release"``/``"warn"``, or
                       ``RLOCK_LOCK_ORDER_CHECK`` not True/False.
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

import inspect
import logging
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import redis
from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register
from django.core.signals import got_request_exception
from django.dispatch import receiver
from django.urls import get_resolver
from django.utils.module_loading import import_string

from django_rlock import _conf as conf
from django_rlock._handler import create_backend, locks
from django_rlock._web.shortcuts import rlock, semaphore
from django_rlock.backends.locmem import LocMemLockBackend
from django_rlock.exceptions import InvalidLockNameError, LockError, LockSettingError
from django_rlock.middleware import LockErrorMiddleware

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


# -- Missing pieces: a view's lock errors with nothing to answer them ----------------
#
# ``django_rlock.W020`` (every check run, tag ``urls``): a view of the URLconf calls
# ``rlock()``, ``semaphore()`` or ``locks[...]`` while ``MIDDLEWARE`` has no
# ``LockErrorMiddleware``: a busy lock there answers 500, not 409. At run time, the
# first lock error that escapes a view unanswered is logged once, naming the fix (a
# check cannot see every call path).

#: The names whose use in a view's code means it takes locks itself (not ``@locked``).
_LOCK_TAKERS = {"rlock": rlock, "semaphore": semaphore, "locks": locks}

#: Lock errors already told about by :func:`hint_unanswered_lock_error` (once each).
_told: set[type[BaseException]] = set()


def has_lock_error_middleware() -> bool:
    """Whether ``MIDDLEWARE`` has ``LockErrorMiddleware`` (or a subclass of it)."""
    for path in getattr(settings, "MIDDLEWARE", None) or ():
        try:
            middleware = import_string(path)
        except ImportError:
            continue  # Django reports an unimportable middleware itself
        if isinstance(middleware, type) and issubclass(middleware, LockErrorMiddleware):
            return True
    return False


def _view_functions(patterns: Sequence[Any]) -> Iterator[Callable[..., Any]]:
    """Every view function of a URLconf's ``patterns``: class-based views' methods too."""
    for pattern in patterns:
        nested = getattr(pattern, "url_patterns", None)
        if nested is not None:
            yield from _view_functions(nested)
            continue
        callback = getattr(pattern, "callback", None)
        view_class = getattr(callback, "view_class", None) or getattr(callback, "cls", None)
        if isinstance(view_class, type):
            yield from (
                method for method in vars(view_class).values() if inspect.isfunction(method)
            )
        elif callable(callback):
            yield callback


def _takes_locks(view: Callable[..., Any]) -> bool:
    """Whether ``view`` (or a function it wraps) calls ``rlock``, ``semaphore`` or ``locks``.

    Read from the code's global names, each resolved in the function's globals
    to django-rlock's own object (``from django_rlock import rlock``, or
    ``django_rlock.rlock``): another ``rlock`` is not ours.
    """
    ours = {id(taker) for taker in _LOCK_TAKERS.values()}
    function: Any = view
    for _ in range(20):  # a chain of decorators, bounded
        code = getattr(function, "__code__", None)
        scope = getattr(function, "__globals__", {})
        if code is not None and not str(getattr(function, "__module__", "")).startswith(
            "django_rlock"
        ):
            package = sys.modules.get("django_rlock")
            for names in _global_names(code):
                if any(id(scope.get(name)) in ours for name in names):
                    return True
                qualified = set(names) & set(_LOCK_TAKERS)  # django_rlock.rlock(...)
                if qualified and package is not None and scope.get("django_rlock") is package:
                    return True
        function = getattr(function, "__wrapped__", None)
        if function is None:
            return False
    return False


def _global_names(code: types.CodeType) -> Iterator[tuple[str, ...]]:
    """The global and attribute names of ``code`` and of the functions nested in it."""
    yield code.co_names
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _global_names(constant)


# Run with every check run (runserver, migrate, check), as Django's own checks of the
# URLconf are, not only by `check --deploy`: in development a busy lock is rare, so the
# run-time hint below may never fire before production, while runserver shows this at
# start. It reads each view's code names once (no call), so it costs little beside
# Django's loading of the URLconf. Tagged "urls" only, as Django's URLconf checks are:
# `--tag django_rlock` stays the settings'.
@register("urls")
def check_lock_error_middleware(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """W020: views take locks with ``rlock()`` while nothing turns a busy lock into a 409."""
    if has_lock_error_middleware():
        return []
    try:
        patterns = get_resolver().url_patterns
    except Exception:  # noqa: BLE001 -- a broken URLconf is reported by Django's own checks
        return []
    takers = sorted(
        {
            f"{view.__module__}.{view.__qualname__}"
            for view in _view_functions(patterns)
            if _takes_locks(view)
        }
    )
    if not takers:
        return []
    shown = ", ".join(takers[:5]) + (f" and {len(takers) - 5} more" if len(takers) > 5 else "")
    return [
        Warning(
            f"Views take locks with rlock(), semaphore() or locks[...] ({shown}) but MIDDLEWARE "
            "has no LockErrorMiddleware: a busy lock there answers 500 (LockTimeout), and so "
            "does its server being down (LockUnavailableError).",
            hint="Add 'django_rlock.middleware.LockErrorMiddleware' to MIDDLEWARE (409 with "
            "Retry-After, 503 when the server is down), or lock the view with @locked, which "
            "answers its own lock's errors. Silence django_rlock.W020 if a 500 is intended.",
            id="django_rlock.W020",
        )
    ]


@receiver(got_request_exception, dispatch_uid="django_rlock.hint_unanswered_lock_error")
def hint_unanswered_lock_error(sender: object, request: Any = None, **kwargs: Any) -> None:
    """Log, once per error class, a lock error that escaped a view with no middleware for it.

    Django sends ``got_request_exception`` inside its ``except`` block, only for an
    exception no middleware answered: a ``LockErrorMiddleware`` would have.
    """
    error = sys.exc_info()[1]
    if not isinstance(error, LockError | InvalidLockNameError) or type(error) in _told:
        return
    if has_lock_error_middleware():
        return  # it is there, and chose to let this one through ("raise")
    _told.add(type(error))
    path = getattr(request, "path", "?")
    logging.getLogger("django_rlock").warning(
        "%s escaped the view of %s and answers 500: add "
        "'django_rlock.middleware.LockErrorMiddleware' to MIDDLEWARE to answer lock errors "
        "(a busy lock: 409 with Retry-After; its server down: 503), or lock the view with "
        "@locked (told once per error class)",
        type(error).__name__,
        path,
    )
