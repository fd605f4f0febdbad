"""Where a task's locks come from: Django's ``locks`` handler or a Celery-only client.

The source is chosen per Celery app, in this order:

1. ``rlock_url`` is set in the Celery config: a Celery-only :class:`LockClient` on
   that server (an explicit Celery setting wins, even inside a Django project);
2. Django settings are configured: ``django_rlock.locks[lock_using]``, so
   ``RLOCKS`` and the ``RLOCK_*`` settings apply exactly as they do to views;
3. otherwise a Celery-only client on ``broker_url``, when that is a Redis URL.

Celery-only settings (``app.conf``, or ``CELERY_RLOCK_*`` with the usual
``namespace="CELERY"``):

``rlock_url``
    Redis URL of the lock server (default: ``broker_url`` when it is Redis).
``rlock_key_prefix``
    Namespace of the lock keys (default ``"rlock"``).
``rlock_watchdog_timeout``
    Seconds a lock outlives its last renewal (default 30); a worker that dies
    leaves its locks for at most this long.

The elected beat (:mod:`celery_rlock.beat`) reads two more, Django or not:

``rlock_beat_scheduler``
    The scheduler that keeps the schedule, as ``beat_scheduler`` names one
    (default ``"celery.beat:PersistentScheduler"``).
``rlock_beat_lock``
    The name of the lock whose holder is the leading beat (default ``"celery-beat"``).

The Celery-only path knows one server, so ``lock_using`` must be ``"default"``
there. The settings are checked when the worker starts (see
:mod:`celery_rlock._worker`) and again, lazily, by the first lock of a process
that is not a worker (a producer using ``once=True``, a test calling a task).
"""

from __future__ import annotations

import importlib
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from django_rlock.core import LockClient, RateLimiter, RLock
from django_rlock.core._faces import check_key_prefix, check_name, check_watchdog_timeout, forking
from django_rlock.core.defaults import (
    DEFAULT_KEY_PREFIX,
    DEFAULT_LOCK_ALIAS,
    DEFAULT_WATCHDOG_TIMEOUT,
)

if TYPE_CHECKING:
    from celery import Celery

_REDIS_SCHEMES: Final = ("redis://", "rediss://", "unix://")

#: The scheduler an elected beat wraps unless ``rlock_beat_scheduler`` names another.
DEFAULT_BEAT_SCHEDULER: Final = "celery.beat:PersistentScheduler"

#: The election lock of the beats unless ``rlock_beat_lock`` names another.
DEFAULT_BEAT_LOCK: Final = "celery-beat"


class ConfigurationError(ValueError):
    """The Celery-side lock configuration is unusable (raised at worker start)."""


@dataclass(frozen=True, slots=True)
class CelerySettings:
    """The Celery-only lock settings of one app, checked."""

    url: str
    key_prefix: str
    watchdog_timeout: float

    @classmethod
    def from_app(cls, app: Celery) -> CelerySettings:
        """Read and check ``rlock_url``, ``rlock_key_prefix``, ``rlock_watchdog_timeout``."""
        conf = app.conf
        url = conf.get("rlock_url")
        if url is None:
            broker = conf.get("broker_url")
            if not (isinstance(broker, str) and broker.startswith(_REDIS_SCHEMES)):
                raise ConfigurationError(
                    "celery_rlock needs a Redis server: set the Celery setting rlock_url "
                    f"(broker_url {_describe_url(broker)} is not a redis:// URL to fall back on)"
                )
            url = broker
        elif not (isinstance(url, str) and url.startswith(_REDIS_SCHEMES)):
            raise ConfigurationError(
                f"rlock_url must be a redis://, rediss:// or unix:// URL, got {_describe_url(url)}"
            )
        try:
            key_prefix = check_key_prefix(conf.get("rlock_key_prefix", DEFAULT_KEY_PREFIX))
            watchdog_timeout = check_watchdog_timeout(
                conf.get("rlock_watchdog_timeout", DEFAULT_WATCHDOG_TIMEOUT)
            )
        except ValueError as error:
            raise ConfigurationError(f"celery_rlock setting: rlock_{error}") from None
        return cls(url=url, key_prefix=key_prefix, watchdog_timeout=watchdog_timeout)


@dataclass(frozen=True, slots=True)
class BeatSettings:
    """The elected beat's settings of one app, checked (see :mod:`celery_rlock.beat`)."""

    #: The wrapped scheduler: a ``"module:Class"`` (or dotted) path, or the class itself.
    scheduler: str | type
    #: The election lock's name.
    lock: str

    @classmethod
    def from_app(cls, app: Celery) -> BeatSettings:
        """Read and check ``rlock_beat_scheduler`` and ``rlock_beat_lock``."""
        conf = app.conf
        scheduler = conf.get("rlock_beat_scheduler") or DEFAULT_BEAT_SCHEDULER
        if not isinstance(scheduler, str | type):
            raise ConfigurationError(
                "rlock_beat_scheduler must name a beat scheduler class "
                f"('module:Class'), got {scheduler!r}"
            )
        try:
            lock = check_name(conf.get("rlock_beat_lock", DEFAULT_BEAT_LOCK))
        except ValueError as error:
            raise ConfigurationError(f"rlock_beat_lock: {error}") from None
        return cls(scheduler=scheduler, lock=lock)


def _describe_url(url: object) -> str:
    # A URL may carry a password: show only its scheme.
    if isinstance(url, str):
        return repr(url.split("://", 1)[0] + "://..." if "://" in url else "<not a URL>")
    return repr(url)


def uses_django(app: Celery) -> bool:
    """True when ``app``'s tasks take their locks from Django's ``locks`` handler."""
    if app.conf.get("rlock_url") is not None:
        return False
    try:
        from django.conf import settings  # noqa: PLC0415 -- Django is optional at run time
    except ImportError:  # pragma: no cover -- Django is an install requirement today
        return False
    return bool(settings.configured)


# One client per app per process. A client built before a fork is usable in the
# child: the core regenerates the owner id and resets the holds after fork.
_clients: weakref.WeakKeyDictionary[Celery, LockClient] = weakref.WeakKeyDictionary()
_clients_lock = threading.Lock()


@forking.after_fork_in_child
def _reset_after_fork() -> None:
    # A prefork child forked while a parent thread built a client must not hang.
    global _clients_lock  # noqa: PLW0603 -- a mutex held across fork stays held in the child
    _clients_lock = threading.Lock()


def lock_client(app: Celery) -> LockClient:
    """The Celery-only LockClient of ``app`` in this process (built on first use)."""
    with _clients_lock:
        client = _clients.get(app)
        if client is None:
            settings = CelerySettings.from_app(app)
            client = LockClient(
                settings.url,
                key_prefix=settings.key_prefix,
                watchdog_timeout=settings.watchdog_timeout,
            )
            _clients[app] = client
        return client


def _django_locks() -> Any:
    # Imported lazily: the Django face may be absent from a Celery-only install
    # and must not be imported (it reads settings) unless Django is configured.
    return importlib.import_module("django_rlock").locks


def get_lock(
    app: Celery,
    using: str,
    name: str,
    *,
    lease: float | None = None,
    permits: int | None = None,
    max_hold: float | None = None,
) -> RLock:
    """The lock called ``name`` for a task of ``app``, from the source chosen above.

    With ``permits``, the semaphore called ``name`` of that many permits instead.
    ``max_hold`` bounds its watchdog holds (see
    :class:`~django_rlock.core._protocol.lock.LockOptions`).
    """
    if uses_django(app):
        backend = _django_locks()[using]
        if permits is not None:
            semaphore: RLock = backend.semaphore(name, permits, lease=lease, max_hold=max_hold)
            return semaphore
        lock: RLock = backend.lock(name, lease=lease, max_hold=max_hold)
        return lock
    if using != DEFAULT_LOCK_ALIAS:
        raise ConfigurationError(
            f"lock_using={using!r}: without Django settings, celery_rlock has only the "
            f"{DEFAULT_LOCK_ALIAS!r} lock server (rlock_url)"
        )
    if permits is not None:
        return lock_client(app).semaphore(name, permits, lease=lease, max_hold=max_hold)
    return lock_client(app).lock(name, lease=lease, max_hold=max_hold)


def get_rate_limiter(app: Celery, using: str, name: str, rate: str) -> RateLimiter:
    """The rate limiter called ``name`` for a task of ``app``, from the source chosen above."""
    if uses_django(app):
        limiter: RateLimiter = _django_locks()[using].rate_limiter(name, rate)
        return limiter
    if using != DEFAULT_LOCK_ALIAS:
        raise ConfigurationError(
            f"lock_using={using!r}: without Django settings, celery_rlock has only the "
            f"{DEFAULT_LOCK_ALIAS!r} lock server (rlock_url)"
        )
    return lock_client(app).rate_limiter(name, rate)


def check_configuration(app: Celery, aliases: set[str]) -> None:
    """Raise ConfigurationError unless every alias in ``aliases`` can make locks.

    Called at worker start, so a mistake stops the worker instead of failing
    its first task. Builds and closes a client: nothing is left open in the
    parent of a prefork pool.
    """
    if uses_django(app):
        locks = _django_locks()
        for alias in sorted(aliases):
            try:
                locks[alias]
            except Exception as error:
                raise ConfigurationError(
                    f"lock_using={alias!r} does not name a usable RLOCKS alias: {error}"
                ) from error
        return
    unknown = sorted(aliases - {DEFAULT_LOCK_ALIAS})
    if unknown:
        raise ConfigurationError(
            f"lock_using={unknown[0]!r}: without Django settings, celery_rlock has only the "
            f"{DEFAULT_LOCK_ALIAS!r} lock server (rlock_url)"
        )
    settings = CelerySettings.from_app(app)
    try:
        LockClient(
            settings.url, key_prefix=settings.key_prefix, watchdog_timeout=settings.watchdog_timeout
        ).close()
    except ValueError as error:
        raise ConfigurationError(f"celery_rlock: {error}") from None
