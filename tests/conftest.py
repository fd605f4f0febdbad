"""Fixtures shared by every test: a real redis-server and clients of it, and PostgreSQL."""

from __future__ import annotations

import faulthandler
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from django_rlock.core import LockClient
from tests.postgres import PostgresServer
from tests.servers import RedisServer

#: Seconds after which a test (setup, call and teardown together) ends the run,
#: with every thread's stack printed. pytest-timeout's 120 s (setup.cfg) fails
#: the test first; this catches what that cannot end: a teardown still stuck
#: after it fired, or a thread that keeps the process from exiting. A hung run
#: must fail with its stacks in CI's log, not sit until CI's own limit.
HARD_STOP = 300


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    faulthandler.dump_traceback_later(HARD_STOP, exit=True, file=sys.stderr)
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()


#: The fixtures that start a server (directly or through another fixture).
SERVER_FIXTURES = frozenset({"redis_server", "postgres_server"})


def pytest_configure(config: pytest.Config) -> None:
    # Declared beside the check that enforces it (the other markers are in setup.cfg).
    config.addinivalue_line(
        "markers",
        "pure: needs no server (no Redis, no PostgreSQL): make test-fast runs these, "
        "with starting a server forbidden",
    )


#: The paths ``make test-fast`` runs (one a line, read by pytest as an @-file):
#: every module with a pure test, or its folder.
PURE_PATHS = Path(__file__).resolve().parent / "pure.txt"


def pure_paths() -> tuple[Path, ...]:
    """The files and folders :data:`PURE_PATHS` lists, resolved from the tests' parent."""
    lines = PURE_PATHS.read_text(encoding="utf-8").split()
    return tuple(PURE_PATHS.parent.parent / line for line in lines)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked ``pure`` (``make test-fast`` runs them) must not use a server fixture.

    Checked at collection, in every run: a wrong mark fails ``make test`` too,
    not only the run that has no server; so does a pure test outside the paths
    of tests/pure.txt (``make test-fast`` would not run it). A test that starts
    a server itself fails under ``make test-fast`` instead (tests/servers.py:
    forbid_servers).
    """
    listed = pure_paths()
    for item in items:
        if item.get_closest_marker("pure") is None:
            continue
        if not any(item.path == path or path in item.path.parents for path in listed):
            raise pytest.UsageError(
                f"{item.nodeid} is marked pure but its module is not in tests/pure.txt:"
                " make test-fast would not run it (add the module there)"
            )
        used = sorted(SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())))
        if wants_postgres(item):
            used.append(f"the {POSTGRES_ALIAS!r} database")
        if used:
            raise pytest.UsageError(
                f"{item.nodeid} is marked pure but needs a server: {', '.join(used)}"
            )
    longest_first(config, items)


#: The test modules that take longest (seconds of wall time summed over their
#: tests, measured in one ``make test``), longest first. Under xdist (noxfile.py:
#: ``--dist loadfile``, a module is one unit of work) they are handed out first,
#: so that no worker starts one of them when the others are nearly done: the
#: suite's end waited for the last long module. A module missing from the list
#: only starts in collection order; a stale entry costs nothing.
LONGEST_MODULES = (
    "tests/topologies/test_cluster_operations.py",  # 70 s
    "tests/model/test_rwlock_model.py",  # 49 s
    "tests/conformance/test_waiting.py",  # 48 s
    "tests/model/test_owner_model.py",  # 41 s
    "tests/example/test_demo.py",  # 36 s
    "tests/celery/test_beat.py",  # 33 s
    "tests/conformance/test_siblings_contract.py",  # 30 s
    "tests/topologies/test_cluster.py",  # 29 s
    "tests/celery/test_delivery.py",  # 26 s
    "tests/model/test_fair_model.py",  # 24 s
    "tests/faults/test_acl_tls.py",  # 24 s
    "tests/model/test_model.py",  # 23 s
    "tests/sync/test_deadlocks.py",  # 21 s
    "tests/model/test_ownership_bugs.py",  # 20 s
    "tests/sync/test_watchdog.py",  # 19 s
    "tests/model/test_semaphore_model.py",  # 19 s
    "tests/celery/test_on_busy.py",  # 18 s
    "tests/process/test_ownership.py",  # 18 s
    "tests/sync/test_deadlock_kinds.py",  # 18 s
    "tests/conformance/test_contract.py",  # 17 s
    "tests/model/test_deadlock_model.py",  # 16 s
    "tests/faults/test_unreachable.py",  # 15 s
)


def longest_first(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, the longest modules first (:data:`LONGEST_MODULES`), a module together."""
    if not hasattr(config, "workerinput"):
        return  # one process: pytest's own order
    rank = {module: index for index, module in enumerate(LONGEST_MODULES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def r(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A plain client of the test server, on an emptied database."""
    client = redis_server.client()
    client.flushall()
    client.config_resetstat()
    yield client
    client.close()


@pytest.fixture
def lock_client(r: redis.Redis, redis_url: str) -> Iterator[LockClient]:
    with LockClient(redis_url, key_prefix="test") as client:
        yield client


# -- PostgreSQL: the "pg" database of Django's tests ----------------------------
#
# A test marked ``@pytest.mark.django_db(..., databases=[..., "pg"])`` runs on a
# private cluster (tests/postgres.py), started once per session when the first
# such test is set up and stopped when pytest ends. Without PostgreSQL those
# tests skip, and fail under CI (which must run them: .ci/run installs it).

#: The alias of the PostgreSQL database in Django's ``DATABASES``.
POSTGRES_ALIAS = "pg"
_postgres = pytest.StashKey["PostgresServer | RuntimeError | OSError"]()


def wants_postgres(item: pytest.Item) -> bool:
    """True when ``item``'s ``django_db`` mark names the PostgreSQL alias."""
    marker = item.get_closest_marker("django_db")
    return marker is not None and POSTGRES_ALIAS in (marker.kwargs.get("databases") or ())


def started_postgres(config: pytest.Config) -> PostgresServer:
    """The session's cluster, started on first use; raises why it cannot run (every time)."""
    found = config.stash.get(_postgres, None)
    if found is None:
        try:
            server = PostgresServer()
            server.__enter__()
        except (RuntimeError, OSError) as error:  # PostgresUnavailable is a RuntimeError
            found = error
        else:
            # After the session's fixtures (Django drops its test database first).
            config.add_cleanup(server.__exit__)
            found = server
        config.stash[_postgres] = found
    if isinstance(found, Exception):
        raise found
    return found


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if not wants_postgres(item):
        return
    try:
        started_postgres(item.config)
    except (RuntimeError, OSError) as error:
        reason = f"PostgreSQL cannot run here: {error}"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI must run the PostgreSQL tests)", pytrace=False)
        pytest.skip(reason)


def add_database(alias: str, config: dict[str, Any]) -> None:
    """Add ``alias`` to Django's ``DATABASES``, also when the connections already read it."""
    from django.conf import settings  # noqa: PLC0415 -- the core's tests run without Django
    from django.db import connections  # noqa: PLC0415

    settings.DATABASES[alias] = config
    connections.settings[alias] = config  # usually the same dict as settings.DATABASES
    connections.configure_settings(connections.settings)  # its defaults (TEST...), in place


@pytest.fixture(scope="session")
def django_db_modify_db_settings(
    django_db_modify_db_settings_parallel_suffix: None, request: pytest.FixtureRequest
) -> None:
    """pytest-django's hook before it creates the test databases: adds "pg" when it is used.

    Only when a collected test names it and the cluster runs; if it cannot, the
    alias stays out and its tests skip or fail in :func:`pytest_runtest_setup`.
    """
    if not any(wants_postgres(item) for item in request.session.items):
        return
    try:
        server = started_postgres(request.config)
    except (RuntimeError, OSError):
        return
    add_database(POSTGRES_ALIAS, server.django_settings())


@pytest.fixture
def postgres_server(request: pytest.FixtureRequest) -> PostgresServer:
    """The session's PostgreSQL cluster (for tests marked with the "pg" database)."""
    return started_postgres(request.config)
