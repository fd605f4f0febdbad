"""``locks``: the lock backends of ``settings.RLOCKS``, as ``caches`` is for CACHES.

::

    from django_rlock import locks

    with locks["default"].lock("order:42"):
        ...

Unlike Django's cache handler, which builds one cache object per thread, this
handler builds ONE backend per alias per process, shared by every thread: a
backend owns connection pools and the engine's client, whose watchdog and
pub/sub connection serve every lock of the process. When ``RLOCKS``, an
``RLOCK_*`` setting or ``CACHES`` changes in tests (``override_settings``,
pytest-django's ``settings``), the handler drops and closes its backends so
the next access sees the new settings.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from typing import Any

from django.apps import apps
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from django_rlock import _conf as conf

# Imported for its receivers: a request's leaked holds are found wherever locks are used.
from django_rlock._scopes import requests  # noqa: F401
from django_rlock.backends.base import BaseLockBackend
from django_rlock.core._faces import forking
from django_rlock.exceptions import InvalidLockBackendError


class MissingAppWarning(RuntimeWarning):
    """Locks are used in a project whose ``INSTALLED_APPS`` lacks ``"django_rlock"``.

    Warned once per process, at the first use of :data:`locks`: without the app,
    the locks work but its system checks (a misspelt setting, a bad alias),
    ``manage.py rlock`` and the admin page are missing. Add ``"django_rlock"``
    to ``INSTALLED_APPS``. A RuntimeWarning, so ``-W error::RuntimeWarning`` or
    pytest's ``filterwarnings = error`` make it fail a test.
    """


_hinted = False


def _hint_missing_app() -> None:
    """Warn once when locks are used without the app: its checks, admin and command are missing.

    Nothing else would say so: without the app, neither its system checks (a
    misspelt setting, a bad alias) nor ``manage.py rlock`` nor the admin page
    exist, and the locks work.
    """
    global _hinted  # noqa: PLW0603 -- once per process
    if _hinted or not apps.ready or apps.is_installed("django_rlock"):
        return
    _hinted = True
    warnings.warn(
        'locks are used but "django_rlock" is not in INSTALLED_APPS: its system checks '
        "(misspelt settings, bad aliases), `manage.py rlock` and the admin page of live "
        'locks are missing. Add "django_rlock" to INSTALLED_APPS.',
        MissingAppWarning,
        stacklevel=4,
    )


def create_backend(alias: str, params: dict[str, Any] | None = None) -> BaseLockBackend:
    """Build the backend of ``alias`` afresh (``params`` default to ``RLOCKS[alias]``).

    Raises :class:`InvalidLockBackendError` for an unknown alias or an unusable
    BACKEND, and other :class:`~django_rlock.exceptions.LockSettingError` for
    bad values; it never connects.
    """
    _hint_missing_app()
    if params is None:
        params = conf.alias_params(alias)
    path = params.get("BACKEND", conf.DEFAULT_BACKEND)
    if not isinstance(path, str):
        raise InvalidLockBackendError(
            f"RLOCKS[{alias!r}]['BACKEND'] must be a dotted path, not {type(path).__name__}"
        )
    try:
        backend_class = import_string(path)
    except ImportError as error:
        raise InvalidLockBackendError(
            f"RLOCKS[{alias!r}]['BACKEND'] = {path!r} could not be imported: {error}"
        ) from None
    if not (isinstance(backend_class, type) and issubclass(backend_class, BaseLockBackend)):
        raise InvalidLockBackendError(
            f"RLOCKS[{alias!r}]['BACKEND'] = {path!r} is not a lock backend "
            "(a subclass of django_rlock.backends.base.BaseLockBackend)"
        )
    backend: BaseLockBackend = backend_class(alias, params)
    return backend


class LockHandler:
    """The lock backends by alias: ``locks["default"]``; one per alias per process."""

    def __init__(self) -> None:
        self._backends: dict[str, BaseLockBackend] = {}
        self._mutex = threading.Lock()
        forking.renew_after_fork(self, "_mutex")

    def __getitem__(self, alias: str) -> BaseLockBackend:
        backend = self._backends.get(alias)
        if backend is not None:
            return backend
        with self._mutex:
            backend = self._backends.get(alias)
            if backend is None:
                backend = self._backends[alias] = create_backend(alias)
        return backend

    def __iter__(self) -> Iterator[str]:
        return iter(conf.aliases())

    def __contains__(self, alias: object) -> bool:
        return alias in conf.aliases()

    def all(self, initialized_only: bool = False) -> list[BaseLockBackend]:
        """Every configured backend, or only those already built."""
        if initialized_only:
            with self._mutex:
                return list(self._backends.values())
        return [self[alias] for alias in self]

    def close_all(self) -> None:
        """Close and forget every built backend; the next access builds it anew."""
        with self._mutex:
            backends, self._backends = list(self._backends.values()), {}
        for backend in backends:
            backend.close()


#: The process's lock backends, by ``RLOCKS`` alias.
locks = LockHandler()


@receiver(setting_changed)
def _reset_on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    # An alias with CACHE uses that cache's pool; django_rlock.cache forgets
    # its own clients when CACHES changes.
    if setting == "RLOCKS" or setting.startswith("RLOCK_") or setting == "CACHES":
        locks.close_all()
