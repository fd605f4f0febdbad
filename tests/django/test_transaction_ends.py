"""A transaction's end gives a deferred hold back at once, on its owner's thread (issue 31).

The release of a ``with rlock(...)`` block that ended inside ``atomic()`` used
to be an entry in Django's on-commit list, and a rollback was told by a
finalizer on an object only that list referred to: a guess the garbage
collector made. When an on-commit hook registered before the lock's raised,
Django stopped running hooks and the release waited for the collector: as long
as the exception was kept; in a reference cycle, until a GC pass on *any*
thread, which then released as that thread (with ``DEBUG=True`` it released
the hold of a thread that had taken the lock since). A connection closed
inside the transaction (``connection.close()``, ``close_old_connections()``
after a caught ``OperationalError``) left the hold to the thread's next use of
that connection, on a request-serving thread: the next request's first query,
which released *that request's* hold while a rival waited.

Now the connection's own ``commit``, ``rollback``, ``close`` and
``set_autocommit`` settle the hold as the transaction ends: these tests run
with the garbage collector off (:func:`no_gc`) wherever it used to matter.
"""

from __future__ import annotations

import gc
import http.client
import json
import logging
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest
from django.core.handlers.wsgi import WSGIHandler
from django.db import (
    OperationalError,
    ProgrammingError,
    close_old_connections,
    connections,
    transaction,
)
from django.http import HttpRequest, JsonResponse
from django.urls import path
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock import locks, rlock
from tests.django.conftest import HANG
from tests.django.test_transactions import (
    NAME,
    ON_POSTGRES,
    START,
    Boom,
    accounts,  # noqa: F401 -- the fixture, used through usefixtures below
    committed_balance,
    on_another_thread,
    takes,
)
from tests.django.views import take_one

pytestmark = [ON_POSTGRES, pytest.mark.usefixtures("accounts")]


class HookFailed(Exception):
    """Raised by an on-commit hook."""


@pytest.fixture
def no_gc() -> Iterator[None]:
    """The garbage collector off for the test: nothing may wait for it."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def rlock_records(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The WARNING and ERROR lines django_rlock logged."""
    return [
        record.getMessage()
        for record in caplog.records
        if record.name.startswith("django_rlock") and record.levelno >= logging.WARNING
    ]


def commit_with_a_failing_hook(kept: list[BaseException], *, cycle: bool) -> None:
    """A transaction whose first on-commit hook (registered before the lock's block) raises.

    The exception is appended to ``kept``, or with ``cycle`` made to refer to
    itself and dropped: only a GC pass would free it (and what its traceback holds).
    """

    def fail() -> None:
        raise HookFailed

    try:
        with transaction.atomic(using="pg"):
            transaction.on_commit(fail, using="pg")
            with rlock(NAME):
                take_one("pg", 1)
            assert not takes(NAME), "released at the block's end, before COMMIT"
    except HookFailed as error:
        if cycle:
            error.args = (error,)
        else:
            kept.append(error)


# -- an on-commit hook before the lock's raises ------------------------------------------------


def test_a_raising_hook_before_the_locks_leaves_no_hold(no_gc: None) -> None:
    kept: list[BaseException] = []
    commit_with_a_failing_hook(kept, cycle=False)
    assert kept, "the hook did not raise"
    assert takes(NAME), "still held after COMMIT: a hook registered before it raised"
    assert committed_balance("pg") == START - 1


def test_a_gc_pass_on_another_thread_releases_nothing(
    no_gc: None, caplog: pytest.LogCaptureFixture
) -> None:
    commit_with_a_failing_hook([], cycle=True)
    free_after_commit = takes(NAME)
    on_another_thread(gc.collect)
    assert free_after_commit, "still held after COMMIT: a hook registered before it raised"
    assert rlock_records(caplog) == [], "a GC pass on another thread tried to release"


@pytest.mark.parametrize("debug", [False, True], ids=["DEBUG=False", "DEBUG=True"])
def test_a_gc_pass_on_a_thread_holding_the_same_lock_keeps_its_hold(
    no_gc: None, settings: SettingsWrapper, caplog: pytest.LogCaptureFixture, debug: bool
) -> None:
    settings.DEBUG = debug
    # On a worker thread, which then ends.
    on_another_thread(lambda: commit_with_a_failing_hook([], cycle=True))
    lock = locks["default"].lock(NAME)
    assert lock.acquire(timeout=HANG), "still held after COMMIT (and its thread's end)"
    try:
        gc.collect()  # on the thread that holds the lock now
        assert not takes(NAME), "a rival got in: the GC pass released this thread's hold"
    finally:
        lock.release()
    assert rlock_records(caplog) == []


# -- a connection closed inside the transaction ------------------------------------------------


def terminate_backend(db: str) -> None:
    """End the calling thread's PostgreSQL session on ``db`` from another connection."""
    with connections[db].cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        row = cursor.fetchone()
    assert row is not None
    pid = int(row[0])

    def terminate() -> None:
        with connections[db].cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])

    on_another_thread(terminate)


def close_the_connection(how: str) -> None:
    """Close the thread's "pg" connection inside its transaction, as ``how`` says."""
    if how == "connection.close()":
        connections["pg"].close()
    elif how == "close_if_unusable_or_obsolete()":
        connections["pg"].close_if_unusable_or_obsolete()
    else:  # a caught OperationalError, then close_old_connections()
        terminate_backend("pg")
        with pytest.raises(OperationalError):
            take_one("pg", 1)
        close_old_connections()


CLOSES = [
    "connection.close()",
    "close_if_unusable_or_obsolete()",
    "OperationalError, close_old_connections()",
]


@pytest.mark.parametrize("how", CLOSES)
def test_a_connection_closed_in_the_transaction_frees_the_lock_then(
    no_gc: None, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    owner = threading.get_ident()
    released_by: list[int] = []
    with transaction.atomic(using="pg"):
        with rlock(NAME) as lock:
            take_one("pg", 1)
        release = lock.release

        def watched_release() -> None:
            released_by.append(threading.get_ident())
            release()

        lock.release = watched_release  # type: ignore[method-assign]
        assert not takes(NAME)
        close_the_connection(how)
        assert released_by == [owner], f"not released on the owner's thread at {how}"
        assert takes(NAME), f"still held after {how} inside the transaction"
    # The thread's next transaction: its hold stays its own until its COMMIT.
    with transaction.atomic(using="pg"):
        with rlock(NAME):
            take_one("pg", 1)  # the first query since the close: a new connection
            assert not takes(NAME), "a rival got in during the next transaction's block"
        assert not takes(NAME), "a rival got in before the next transaction's COMMIT"
    assert takes(NAME)
    assert committed_balance("pg") == START - 1
    assert released_by == [owner]
    assert rlock_records(caplog) == []


# -- the same on a thread serving requests one after another (a sync worker) ----------------


def close_in_a_transaction(request: HttpRequest, how: str) -> JsonResponse:
    """The first request: its transaction's connection closed after a failed query."""
    with transaction.atomic(using="pg"):
        with rlock(NAME):
            take_one("pg", 1)
        close_the_connection(CLOSES[int(how)])
        return JsonResponse({"free": takes(NAME)})


def lock_then_query(request: HttpRequest) -> JsonResponse:
    """The next request: takes the lock, then its first query opens a connection."""
    with rlock(NAME):
        take_one("pg", 1)
        return JsonResponse({"rival_got_in": takes(NAME)})


urlpatterns = [
    path("close/<str:how>/", close_in_a_transaction),
    path("next/", lock_then_query),
]


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def sync_worker() -> Iterator[Callable[[str], tuple[int, Any]]]:
    """A WSGI server serving Django on one thread, one request after another; a GET function."""
    server: WSGIServer = make_server("127.0.0.1", 0, WSGIHandler(), handler_class=QuietHandler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()

    def get(url: str) -> tuple[int, Any]:
        connection = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=HANG)
        try:
            connection.request("GET", url)
            response = connection.getresponse()
            body = response.read()
        finally:
            connection.close()
        return response.status, json.loads(body) if response.status == 200 else body

    try:
        yield get
    finally:
        server.shutdown()
        thread.join(HANG)
        server.server_close()


@pytest.mark.parametrize("how", range(len(CLOSES)), ids=CLOSES)
def test_the_next_request_on_the_thread_keeps_its_hold(
    no_gc: None, settings: SettingsWrapper, caplog: pytest.LogCaptureFixture, how: int
) -> None:
    settings.ROOT_URLCONF = __name__
    with sync_worker() as get:
        first = get(f"/close/{how}/")
        second = get("/next/")
    assert second == (200, {"rival_got_in": False}), "the next request's hold was released"
    assert first == (200, {"free": True}), "held past the close"
    assert rlock_records(caplog) == []


# -- other ends --------------------------------------------------------------------------------


def test_hooks_of_the_transaction_run_before_the_release(no_gc: None) -> None:
    seen: list[str] = []
    with transaction.atomic(using="pg"):
        transaction.on_commit(lambda: seen.append(f"before: free={takes(NAME)}"), using="pg")
        with rlock(NAME):
            take_one("pg", 1)
        transaction.on_commit(lambda: seen.append(f"after: free={takes(NAME)}"), using="pg")
    assert seen == ["before: free=False", "after: free=False"]
    assert takes(NAME)


def test_a_hook_with_a_transaction_of_its_own_releases_in_turn(no_gc: None) -> None:
    """A hook's own transaction (the outer one's hooks still running) settles its own hold."""
    seen: list[bool] = []

    def hook() -> None:
        with transaction.atomic(using="pg"), rlock("other"):
            take_one("pg", 1)
        seen.extend([takes("other"), takes(NAME)])

    with transaction.atomic(using="pg"):
        transaction.on_commit(hook, using="pg")
        with rlock(NAME):
            take_one("pg", 1)
    assert seen == [True, False], "the hook's lock free after its COMMIT, the outer still held"
    assert takes(NAME)
    assert committed_balance("pg") == START - 2


@pytest.mark.parametrize("end", ["commit", "rollback"])
def test_manual_transaction_management_ends_at_commit_or_rollback(no_gc: None, end: str) -> None:
    connection = connections["pg"]
    connection.set_autocommit(False)
    try:
        with transaction.atomic(using="pg"), rlock(NAME):
            take_one("pg", 1)
        assert not takes(NAME), "released as atomic() ended inside a manual transaction"
        if end == "commit":
            transaction.commit(using="pg")
        else:
            transaction.rollback(using="pg")
        assert takes(NAME), f"still held after {end}()"
    finally:
        connection.set_autocommit(True)
    assert committed_balance("pg") == START - (1 if end == "commit" else 0)


def test_a_commit_on_an_ended_session_frees_the_lock(no_gc: None) -> None:
    """COMMIT fails (the session was ended), then Django rolls back or closes the connection."""

    def commit_on_an_ended_session() -> None:
        with transaction.atomic(using="pg"):
            with rlock(NAME):
                take_one("pg", 1)
            terminate_backend("pg")

    with pytest.raises(OperationalError):
        commit_on_an_ended_session()
    assert takes(NAME), "still held after the failed COMMIT"
    assert committed_balance("pg") == START


# -- how long after the transaction's end the lock is free -------------------------------------


def test_release_delays(no_gc: None) -> None:
    """Printed, not asserted: the milliseconds from the end of COMMIT, ROLLBACK or close
    (the database call's return) until the release has deleted the key, and until a
    rival blocked in ``acquire()`` is granted; medians of 40 (``pytest -s`` shows them)."""
    rounds = 40
    results: dict[str, tuple[list[float], list[float]]] = {}
    for end in ("COMMIT", "ROLLBACK", "close"):
        released, granted = [], []
        for _ in range(rounds):
            ended_at, released_at, granted_at = one_end(end)
            released.append((released_at - ended_at) * 1000)
            granted.append((granted_at - ended_at) * 1000)
        results[end] = released, granted
    for end, (released, granted) in results.items():
        print(
            f"after {end}: released {statistics.median(released):.2f} ms "
            f"(max {max(released):.2f}), a waiting rival granted "
            f"{statistics.median(granted):.2f} ms (max {max(granted):.2f})"
        )
        assert max(released) < HANG * 1000
        assert max(granted) < HANG * 1000


def one_end(end: str) -> tuple[float, float, float]:
    """One transaction ending by ``end``; when its database call returned, when the
    release returned, when a rival waiting in ``acquire()`` got the lock."""
    connection = connections["pg"]
    stamps: dict[str, float] = {}
    rival_waiting = threading.Event()

    def rival() -> None:
        lock = locks["default"].lock(NAME)
        rival_waiting.set()
        assert lock.acquire(timeout=HANG)
        stamps["granted"] = time.perf_counter()
        lock.release()

    def stamped(method: Callable[[], None]) -> Callable[[], None]:
        def call() -> None:
            try:
                method()
            finally:
                stamps.setdefault("ended", time.perf_counter())

        return call

    with stamp_database_calls(connection, stamped):
        waiter = threading.Thread(target=lambda: on_another_thread(rival))
        try:
            with transaction.atomic(using="pg"):
                with rlock(NAME) as lock:
                    take_one("pg", 1)
                    waiter.start()
                    assert rival_waiting.wait(HANG)
                    time.sleep(0.05)  # not measured: lets the rival reach its wait
                release = lock.release

                def stamped_release() -> None:
                    release()
                    stamps["released"] = time.perf_counter()

                lock.release = stamped_release  # type: ignore[method-assign]
                if end == "ROLLBACK":
                    raise Boom
                if end == "close":
                    connection.close()
        except Boom:
            pass
        finally:
            waiter.join(HANG)
    return stamps["ended"], stamps["released"], stamps["granted"]


@contextmanager
def stamp_database_calls(
    connection: Any, stamped: Callable[[Callable[[], None]], Callable[[], None]]
) -> Iterator[None]:
    """The DB-API connection's commit, rollback and close, stamped as they return.

    Django's wrapper calls them through ``_commit``, ``_rollback`` and ``_close``.
    """
    names = ("_commit", "_rollback", "_close")
    for name in names:
        setattr(connection, name, stamped(getattr(connection, name)))
    try:
        yield
    finally:
        for name in names:
            delattr(connection, name)


# -- what is never released ---------------------------------------------------------------------


def test_a_hold_taken_anew_in_the_transaction_is_not_the_deferred_ones(
    no_gc: None, caplog: pytest.LogCaptureFixture
) -> None:
    """The block's hold given back by hand, then a new hold: the COMMIT gives back neither."""
    with transaction.atomic(using="pg"):
        with rlock(NAME) as lock:
            take_one("pg", 1)
        lock.release()  # by hand, at once
        assert takes(NAME)
        again = locks["default"].lock(NAME)
        assert again.acquire(blocking=False)
    try:
        assert not takes(NAME), "the COMMIT gave back the hold taken after the block's"
    finally:
        again.release()
    assert takes(NAME)
    assert any("no longer the thread's newest" in line for line in rlock_records(caplog))


def test_a_transaction_ended_on_another_thread_keeps_the_hold(
    no_gc: None, caplog: pytest.LogCaptureFixture
) -> None:
    """A connection shared with another thread, closed there: reported, never released
    as that thread; the owner gives it back itself."""
    connection = connections["pg"]
    with transaction.atomic(using="pg"):
        with rlock(NAME) as lock:
            take_one("pg", 1)
        connection.inc_thread_sharing()
        try:
            on_another_thread(connection.close)
        finally:
            connection.dec_thread_sharing()
        assert not takes(NAME), "released as the thread that closed the connection"
        lock.release()
    assert takes(NAME)
    assert any("on another thread" in line for line in rlock_records(caplog))


def test_a_commit_that_raised_before_the_database_keeps_the_hold_until_the_transaction_ends(
    no_gc: None, caplog: pytest.LogCaptureFixture
) -> None:
    """A COMMIT that raised what is not a database error: ``atomic()`` neither rolls back
    nor can turn autocommit back on, and the transaction stays open on the server, so
    the hold waits for its real end (here ``close_old_connections()``, as at a request's
    end), not released as ``atomic()`` returned. (PostgreSQL refuses autocommit inside
    a transaction: that ProgrammingError is what ``atomic()`` raises.)"""
    connection = connections["pg"]

    def broken_commit() -> None:
        raise Boom

    def commit_that_raises() -> None:
        with transaction.atomic(using="pg"):
            with rlock(NAME):
                take_one("pg", 1)
            # The backend's own COMMIT, under Django's commit() (a private name: tests only).
            setattr(connection, "_commit", broken_commit)  # noqa: B010 -- not in the stubs

    try:
        with pytest.raises(ProgrammingError, match="autocommit"):
            commit_that_raises()
    finally:
        delattr(connection, "_commit")
    assert not takes(NAME), "released while its transaction was still open"
    close_old_connections()
    assert takes(NAME), "still held after its connection was closed"
    assert committed_balance("pg") == START
