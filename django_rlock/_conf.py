"""The one place where django-rlock reads Django settings.

Lookup order, for a setting ``NAME`` of lock alias ``alias``:

1. the keyword given to the call (``@locked(..., busy_response=...)``), when given;
2. ``settings.RLOCKS[alias]["NAME"]``;
3. the global ``settings.RLOCK_<NAME>``;
4. the default in :data:`DEFAULTS`.

``BACKEND``, ``LOCATION``, ``CACHE`` and ``OPTIONS`` describe one alias's
server and exist only inside ``RLOCKS[alias]``. ``RLOCK_METRICS`` concerns the
whole process and exists only as that global setting. With no ``RLOCKS`` setting at
all, the ``default`` alias is Redis at ``redis://127.0.0.1:6379/0``.

Every reader checks the value it returns and raises :class:`LockSettingError`
(an ``ImproperlyConfigured``) naming the setting exactly as the user wrote it;
the system checks in :mod:`django_rlock._checks` call the same readers.
"""

from __future__ import annotations

import difflib
import importlib
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils.module_loading import import_string

from django_rlock.core._faces import (
    LAYOUTS,
    RLOCK,
    SHARDED_SUBSCRIPTION_MODES,
    check_deadlock_timeout,
    check_key_prefix,
    check_lock_order_check,
    check_max_hold,
    check_watchdog_timeout,
)
from django_rlock.core.defaults import (
    DEFAULT_DEADLOCK_TIMEOUT,
    DEFAULT_KEY_PREFIX,
    DEFAULT_LOCK_ALIAS,
    DEFAULT_REPLICA_SYNC_TIMEOUT,
    DEFAULT_WATCHDOG_TIMEOUT,
)
from django_rlock.core.exceptions import DeadlockError, LockTimeout
from django_rlock.exceptions import InvalidLockBackendError, LockSettingError

DEFAULT_BACKEND: Final = "django_rlock.backends.redis.RedisLockBackend"
DEFAULT_LOCATION: Final = "redis://127.0.0.1:6379/0"


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


#: "Not given at the call": distinct from None, which can be a real value.
UNSET: Final = _Unset()

#: Settings that exist per alias and globally (``RLOCK_<NAME>``), with their defaults.
DEFAULTS: Final[Mapping[str, object]] = {
    "KEY_PREFIX": DEFAULT_KEY_PREFIX,
    "WATCHDOG_TIMEOUT": DEFAULT_WATCHDOG_TIMEOUT,
    "SLOW_WAIT": None,
    "SLOW_HOLD": None,
    "BUSY_RESPONSE": 409,
    "MIN_REPLICAS": 0,
    "REPLICA_SYNC_TIMEOUT": DEFAULT_REPLICA_SYNC_TIMEOUT,
    "TRANSACTION": "auto",
    "LEAKED": "release",
    "MAX_HOLD": None,
    "LAYOUT": RLOCK,
    "SHARDED_SUBSCRIPTION": "auto",
    "DEADLOCK_TIMEOUT": DEFAULT_DEADLOCK_TIMEOUT,
}

#: Every key an ``RLOCKS`` alias may contain.
ALIAS_KEYS: Final = frozenset({"BACKEND", "LOCATION", "CACHE", "OPTIONS", *DEFAULTS})

#: The global settings that exist only as globals, for the whole process
#: (some are read by modules that are not in every release: knowing their
#: names keeps the check below from refusing them).
GLOBAL_ONLY_SETTINGS: Final = frozenset(
    {
        "RLOCK_METRICS",
        "RLOCK_DEADLOCK_TIMEOUT",
        "RLOCK_LOCK_ORDER_CHECK",
        "RLOCK_RATE_LIMITED_VIEW",
    }
)

#: Every ``RLOCK_*`` global setting django-rlock reads.
GLOBAL_SETTINGS: Final = frozenset({*(f"RLOCK_{name}" for name in DEFAULTS), *GLOBAL_ONLY_SETTINGS})

#: What ``TRANSACTION`` takes: bind a block's release to the open transaction, or not.
TRANSACTION_CHOICES: Final = ("auto", "ignore")

#: What ``LEAKED`` takes: give a leaked hold back at once, or only report it.
LEAKED_CHOICES: Final = ("release", "warn")

#: The values ``RLOCK_METRICS`` takes besides None (no metrics, the default).
METRICS_CHOICES: Final = ("prometheus",)

#: What a view answers when its lock stays busy (or its wait was a deadlock's
#: victim): an HTTP status, ``"raise"``, or a callable
#: ``(request, LockTimeout | DeadlockError) -> HttpResponse`` (or its dotted path).
BusyResponse = int | str | Callable[[HttpRequest, LockTimeout | DeadlockError], HttpResponse]


def lock_settings() -> dict[str, dict[str, Any]]:
    """``settings.RLOCKS``, checked for shape; a lone Redis ``default`` when unset."""
    configured = getattr(settings, "RLOCKS", None)
    if configured is None:
        return {DEFAULT_LOCK_ALIAS: {}}
    if not isinstance(configured, dict):
        raise LockSettingError(
            f"RLOCKS must be a dict of lock aliases, not {type(configured).__name__}"
        )
    if DEFAULT_LOCK_ALIAS not in configured:
        raise LockSettingError(f"RLOCKS must define a {DEFAULT_LOCK_ALIAS!r} lock alias")
    for alias, params in configured.items():
        if not isinstance(alias, str) or not isinstance(params, dict):
            raise LockSettingError(
                f"RLOCKS[{alias!r}] must map a str alias to a dict, not {type(params).__name__}"
            )
    return configured


def aliases() -> list[str]:
    """The configured lock aliases."""
    return list(lock_settings())


def alias_params(alias: str) -> dict[str, Any]:
    """``RLOCKS[alias]``; raises :class:`InvalidLockBackendError` for an unknown alias."""
    configured = lock_settings()
    if alias not in configured:
        raise InvalidLockBackendError(
            f"the lock alias {alias!r} is not in RLOCKS (configured: {', '.join(configured)})"
        )
    return configured[alias]


def check_alias_keys(alias: str, params: Mapping[str, object]) -> None:
    """Refuse a key of ``RLOCKS[alias]`` that no backend reads (a typo must not fall back).

    ``LOCATON`` would otherwise leave the default ``LOCATION`` in force: a
    lock on 127.0.0.1:6379 instead of the server meant.
    """
    for key in params:
        if key not in ALIAS_KEYS:
            raise LockSettingError(
                f"RLOCKS[{alias!r}] has an unknown key {key!r}{_did_you_mean(key, ALIAS_KEYS)}; "
                f"known keys: {', '.join(sorted(ALIAS_KEYS))}",
                check_id="django_rlock.E007",
            )


def check_options(
    alias: str, options: Mapping[str, object], accepted: Mapping[str, object], what: str
) -> None:
    """Refuse an ``OPTIONS`` key not in ``accepted``, or a value of the wrong kind.

    ``accepted`` maps each option to its default (see
    :func:`django_rlock.core._sync.connection.connection_options`): an option whose
    default is a bool takes a bool, one whose default is a number takes a
    number or None. ``what`` names what the options are passed to.
    """
    where = f"RLOCKS[{alias!r}]['OPTIONS']"
    for key, value in options.items():
        if key not in accepted:
            raise LockSettingError(
                f"{where} has an unknown key {key!r}{_did_you_mean(key, accepted)}: "
                f"it is not an option of {what}",
                check_id="django_rlock.E007",
            )
        default = accepted[key]
        if isinstance(default, bool):
            wrong = not isinstance(value, bool)
            wanted = "True or False"
        elif isinstance(default, int | float):
            wrong = value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float)
            )
            wanted = "a number or None"
        else:
            continue
        if wrong:
            raise LockSettingError(
                f"{where}[{key!r}] must be {wanted}, got {value!r}", check_id="django_rlock.E003"
            )


def misspelt_settings() -> list[str]:
    """What is wrong with each Django setting named like django-rlock's that nothing reads.

    An ``RLOCK_*`` global not in :data:`GLOBAL_SETTINGS` (``RLOCK_WATCHDOG_TIMOUT``
    would leave the default in force), and a dict setting spelt like ``RLOCKS``
    and shaped like it or like one alias (``RLOCK``, ``RLOCS``: the aliases would
    fall back to the default Redis).
    Each message names the setting and its close match.
    """
    found = []
    configured = hasattr(settings, "RLOCKS")
    for name in sorted(dir(settings)):
        if not name.isupper() or name == "RLOCKS" or name in GLOBAL_SETTINGS:
            continue
        if name.startswith("RLOCK_"):
            found.append(_unknown_global(name))
        elif name.startswith("R") and difflib.get_close_matches(name, ["RLOCKS"], cutoff=0.8):
            if not _looks_like_lock_settings(getattr(settings, name, None)):
                continue  # someone else's setting
            fallback = (
                ""
                if configured
                else f", which is not set: every lock uses the default Redis at {DEFAULT_LOCATION}"
            )
            found.append(
                f"{name} is not a django-rlock setting (did you mean 'RLOCKS'?): the lock "
                f"aliases are read from RLOCKS only{fallback}"
            )
    return found


def _looks_like_lock_settings(value: object) -> bool:
    """Whether ``value`` is shaped like ``RLOCKS`` (aliases) or like one alias's settings."""
    if not isinstance(value, dict) or not value:
        return False
    return all(isinstance(params, dict) for params in value.values()) or bool(
        ALIAS_KEYS.intersection(value)
    )


def _unknown_global(name: str) -> str:
    key = name.removeprefix("RLOCK_")
    if key in ALIAS_KEYS:
        return (
            f"{name} is not a django-rlock setting: {key} exists only inside an alias, "
            f"RLOCKS[alias][{key!r}]"
        )
    close = _did_you_mean(name, [*GLOBAL_SETTINGS, "RLOCKS"])
    return (
        f"{name} is not a django-rlock setting{close}: nothing reads it; "
        f"the RLOCK_* settings are {', '.join(sorted(GLOBAL_SETTINGS))}"
    )


def _did_you_mean(key: object, known: Iterable[str]) -> str:
    if not isinstance(key, str):
        return ""
    close = difflib.get_close_matches(key, list(known), n=1)
    if not close:
        close = [name for name in known if name.lower() == key.lower()]
    return f" (did you mean {close[0]!r}?)" if close else ""


def lookup(
    name: str, alias: str | None = DEFAULT_LOCK_ALIAS, value: object = UNSET
) -> tuple[Any, str]:
    """``(value, where it came from)`` for setting ``name``, in the documented order.

    ``alias=None`` skips ``RLOCKS`` (for locks that belong to no alias, such as
    ``cache.lock()``).
    """
    if name not in DEFAULTS:
        raise ValueError(f"{name!r} is not a django-rlock setting (known: {', '.join(DEFAULTS)})")
    if value is not UNSET:
        return value, f"the {name.lower()} argument"
    params = {} if alias is None else alias_params(alias)
    if name in params:
        return params[name], f"RLOCKS[{alias!r}][{name!r}]"
    global_name = f"RLOCK_{name}"
    if hasattr(settings, global_name):
        return getattr(settings, global_name), global_name
    return DEFAULTS[name], f"the default {name}"


def seconds_or_none(name: str, alias: str = DEFAULT_LOCK_ALIAS) -> float | None:
    """A threshold in seconds (``SLOW_WAIT``, ``SLOW_HOLD``): None (off) or a number >= 0."""
    value, source = lookup(name, alias)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise LockSettingError(
            f"{source} must be a number of seconds or None, got {value!r}",
            check_id="django_rlock.E004",
        )
    if value < 0:
        raise LockSettingError(
            f"{source} must be >= 0 seconds or None, got {value!r}", check_id="django_rlock.E004"
        )
    return float(value)


def transaction(alias: str = DEFAULT_LOCK_ALIAS, value: object = UNSET) -> str:
    """``TRANSACTION``: ``"auto"`` (default) or ``"ignore"``.

    ``"auto"`` keeps a hold whose ``with`` block ends inside an atomic block
    until the outermost transaction ends; ``"ignore"`` releases at the block's end
    (see :mod:`django_rlock._scopes.transactions`).
    """
    return _choice("TRANSACTION", alias, value, TRANSACTION_CHOICES, "django_rlock.E009")


def leaked(alias: str = DEFAULT_LOCK_ALIAS) -> str:
    """``LEAKED``: ``"release"`` (default) gives a leaked hold back, ``"warn"`` only reports it."""
    return _choice("LEAKED", alias, UNSET, LEAKED_CHOICES, "django_rlock.E009")


def max_hold(alias: str = DEFAULT_LOCK_ALIAS, value: object = UNSET) -> float | None:
    """``MAX_HOLD``: None (default, no bound) or the seconds a watchdog hold may last."""
    found, source = lookup("MAX_HOLD", alias, value)
    try:
        return check_max_hold(found)
    except ValueError as error:
        raise LockSettingError(f"{source}: {error}", check_id="django_rlock.E004") from None


def deadlock_timeout(alias: str | None = DEFAULT_LOCK_ALIAS) -> float | None:
    """``DEADLOCK_TIMEOUT``: seconds a waiter waits before it looks for a deadlock (default 1).

    None turns detection off (see docs/deadlocks.md).
    """
    found, source = lookup("DEADLOCK_TIMEOUT", alias)
    try:
        return check_deadlock_timeout(found)
    except ValueError as error:
        raise LockSettingError(f"{source}: {error}", check_id="django_rlock.E004") from None


def lock_order_check() -> bool:
    """``RLOCK_LOCK_ORDER_CHECK``: warn when locks are taken in opposite orders (default False).

    Global only: one graph of lock orders per process, whichever alias takes
    the locks (see docs/deadlocks.md). For tests and staging.
    """
    value = getattr(settings, "RLOCK_LOCK_ORDER_CHECK", False)
    try:
        return check_lock_order_check(value)
    except ValueError:
        raise LockSettingError(
            f"RLOCK_LOCK_ORDER_CHECK must be True or False, got {value!r}",
            check_id="django_rlock.E009",
        ) from None


def _choice(name: str, alias: str, value: object, choices: tuple[str, ...], check_id: str) -> str:
    found, source = lookup(name, alias, value)
    if found not in choices:
        raise LockSettingError(
            f"{source} must be one of {', '.join(map(repr, choices))}, got {found!r}",
            check_id=check_id,
        )
    return str(found)


def metrics() -> str | None:
    """``RLOCK_METRICS``: None (the default: no metrics) or ``"prometheus"``.

    ``"prometheus"`` needs prometheus_client (the ``django-rlock[prometheus]``
    extra); without it this raises, naming the extra.
    """
    value = getattr(settings, "RLOCK_METRICS", None)
    if value is None:
        return None
    if value not in METRICS_CHOICES:
        raise LockSettingError(
            f"RLOCK_METRICS must be None or one of {', '.join(map(repr, METRICS_CHOICES))}, "
            f"got {value!r}",
            check_id="django_rlock.E008",
        )
    try:
        importlib.import_module("prometheus_client")
    except ImportError:
        raise LockSettingError(
            f"RLOCK_METRICS = {value!r} needs prometheus_client, which is not installed: "
            "pip install 'django-rlock[prometheus]'",
            check_id="django_rlock.E008",
        ) from None
    return str(value)


def watchdog_timeout(alias: str | None = DEFAULT_LOCK_ALIAS) -> float:
    """``WATCHDOG_TIMEOUT``: how long an unrenewed lock lives, in seconds.

    At least :data:`~django_rlock.core.defaults.MIN_WATCHDOG_TIMEOUT`: below
    it renewals cannot be relied on to arrive in time.
    """
    seconds = _positive_seconds("WATCHDOG_TIMEOUT", alias)
    try:
        return check_watchdog_timeout(seconds)
    except ValueError as error:
        _, source = lookup("WATCHDOG_TIMEOUT", alias)
        raise LockSettingError(f"{source}: {error}", check_id="django_rlock.E004") from None


def _positive_seconds(name: str, alias: str | None) -> float:
    value, source = lookup(name, alias)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise LockSettingError(
            f"{source} must be a positive number of seconds, got {value!r}",
            check_id="django_rlock.E004",
        )
    return float(value)


def min_replicas(alias: str = DEFAULT_LOCK_ALIAS) -> int:
    """``MIN_REPLICAS``: replicas that must confirm each grant (WAIT); 0 disables it."""
    value, source = lookup("MIN_REPLICAS", alias)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise LockSettingError(
            f"{source} must be an int >= 0, got {value!r}", check_id="django_rlock.E004"
        )
    return value


def replica_sync_timeout(alias: str = DEFAULT_LOCK_ALIAS) -> float:
    """``REPLICA_SYNC_TIMEOUT``: how long a grant waits for its replicas, in seconds (> 0)."""
    return _positive_seconds("REPLICA_SYNC_TIMEOUT", alias)


def key_prefix(alias: str = DEFAULT_LOCK_ALIAS) -> str:
    """``KEY_PREFIX``: the namespace of the alias's Redis keys."""
    value, source = lookup("KEY_PREFIX", alias)
    try:
        return check_key_prefix(value)
    except ValueError as error:
        raise LockSettingError(f"{source}: {error}", check_id="django_rlock.E005") from None


def layout(alias: str = DEFAULT_LOCK_ALIAS) -> str:
    """``LAYOUT``: ``"rlock"`` (default, this library's keys) or ``"redisson"``.

    ``"redisson"`` shares the alias's locks with Java services running
    Redisson (their RLock of the same name): see docs/redisson.md.
    """
    return _choice("LAYOUT", alias, UNSET, LAYOUTS, "django_rlock.E010")


def sharded_subscription(alias: str = DEFAULT_LOCK_ALIAS) -> str:
    """``SHARDED_SUBSCRIPTION``: ``"auto"`` (default), ``"on"`` or ``"off"``.

    Redisson's ``ShardedSubscriptionMode``: whether releases are announced
    with SPUBLISH (``"auto"``: on a Redis >= 7 cluster) or PUBLISH.
    """
    return _choice(
        "SHARDED_SUBSCRIPTION", alias, UNSET, SHARDED_SUBSCRIPTION_MODES, "django_rlock.E010"
    )


def busy_response(alias: str = DEFAULT_LOCK_ALIAS, value: object = UNSET) -> BusyResponse:
    """``BUSY_RESPONSE``: what a locked view answers when its lock stays busy.

    An HTTP status code (default 409, sent with a ``Retry-After`` header), the
    string ``"raise"`` (let :class:`LockTimeout` propagate), or a callable
    ``(request, error) -> HttpResponse``, given itself or as a dotted path.
    """
    found, source = lookup("BUSY_RESPONSE", alias, value)
    return check_busy_response(found, source)


def imported_callable(path: str, source: str, refusal: str) -> Callable[..., Any] | None:
    """What the dotted ``path`` names if it is callable, else None.

    A path that does not import is a :class:`LockSettingError` saying
    ``source = path is <refusal>: <why>`` (E006, the check id of every setting
    that names a callable: ``BUSY_RESPONSE``, ``RLOCK_RATE_LIMITED_VIEW``).
    """
    try:
        found = import_string(path)
    except ImportError as error:
        raise LockSettingError(
            f"{source} = {path!r} is {refusal}: {error}", check_id="django_rlock.E006"
        ) from None
    return found if callable(found) else None


def check_busy_response(found: object, source: str, *, resolve: bool = True) -> BusyResponse:
    """``found`` as a BUSY_RESPONSE, or LockSettingError naming ``source``.

    ``resolve=False`` checks a dotted path's shape without importing it: a
    decorator checks its argument while its own module may be half imported.
    """
    if isinstance(found, int) and not isinstance(found, bool) and 100 <= found <= 599:
        return found
    if found == "raise" or callable(found):
        return found
    if isinstance(found, str) and not resolve:
        module, _, attribute = found.rpartition(".")
        if module and all(part.isidentifier() for part in (*module.split("."), attribute)):
            return found
    elif isinstance(found, str):
        handler = imported_callable(found, source, "neither 'raise' nor an importable callable")
        if handler is not None:
            return handler
    raise LockSettingError(
        f"{source} must be an HTTP status (100-599), 'raise', or a callable "
        f"(request, error) -> HttpResponse, got {found!r}",
        check_id="django_rlock.E006",
    )
