"""A lock's release bound to the database transaction (``transaction="auto"``, the default).

The issue: a view ``@locked("account:{account_id}")`` under ``ATOMIC_REQUESTS``
read a balance, wrote it back less 1, and returned; the lock was released
there, and the transaction committed after. In the few milliseconds of a
managed database's COMMIT the next holder read the balance not yet committed
and overwrote it: three WSGI workers, 12 clients and 120 calls lost updates.

A ``with rlock(...)`` block (or an ``@locked`` call) that ends while a
database connection of the thread is inside ``atomic()`` keeps its hold until
the outermost transaction of every such connection has ended: released after
COMMIT (and its on-commit hooks), or at ROLLBACK (also when the COMMIT fails). A savepoint's end
releases nothing. An explicit ``release()`` is immediate, and
``transaction="ignore"`` (or ``RLOCK_TRANSACTION = "ignore"``) releases at the
block's end, as before.

PostgreSQL's COMMIT is made slow on purpose (tests/postgres.py: a deferred
trigger sleeps 4 ms at COMMIT), SQLite's by a delay before each COMMIT: the
window in which a lock released before COMMIT loses an update.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from io import StringIO
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
from django.core.management import call_command
from django.db import IntegrityError, connections, transaction
from django.db.backends.sqlite3.base import DatabaseWrapper as SQLiteWrapper
from django.test import AsyncClient
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock import locked, locks, rlock
from django_rlock._scopes.transactions import _initialized as open_connections
from django_rlock.exceptions import LockLostError
from tests.children import python_module, read_answer
from tests.django.conftest import HANG
from tests.django.views import ACCOUNTS, take_one
from tests.postgres import PostgresServer, settings_for_child, slow_commit_sql

T = TypeVar("T")

#: The tests that run on PostgreSQL (alias "pg") and the in-memory SQLite (alias "default").
ON_POSTGRES = pytest.mark.django_db(transaction=True, databases=["default", "pg"])
#: Every account's opening balance.
START = 1000
#: Seconds each COMMIT takes longer: PostgreSQL's by a deferred trigger, SQLite's by a sleep.
SLOW_COMMIT = 0.004
#: The lock of account 1 on PostgreSQL, as the views name it.
NAME = "account:pg:1"
ROOT = Path(__file__).resolve().parents[2]


class Boom(Exception):
    """Raised by a test to roll a transaction back."""


# -- helpers -----------------------------------------------------------------------------------


def on_another_thread(work: Callable[[], T]) -> T:
    """``work()`` on a new thread, its database connections closed after it."""

    def run() -> T:
        try:
            return work()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as executor:
        return executor.submit(run).result(timeout=HANG)


def takes(name: str) -> bool:
    """Whether another thread gets lock ``name`` at once (it gives it back if so)."""

    def attempt() -> bool:
        lock = locks["default"].lock(name)
        if not lock.acquire(blocking=False):
            return False
        lock.release()
        return True

    return on_another_thread(attempt)


def committed_balance(db: str, account_id: int = 1) -> int:
    """Account ``account_id``'s balance as another connection sees it (committed)."""

    def read() -> int:
        with connections[db].cursor() as cursor:
            cursor.execute(f"SELECT balance FROM {ACCOUNTS} WHERE id = %s", [account_id])
            row = cursor.fetchone()
        assert row is not None
        return int(row[0])

    return on_another_thread(read)


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + HANG
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not after {HANG} s"
        time.sleep(0.01)


def withdraw_service(db: str, account_id: int = 1) -> int:
    """A service function: its own transaction, the account's lock inside it."""
    with transaction.atomic(using=db), rlock(f"account:{db}:{account_id}"):
        return take_one(db, account_id)


# -- fixtures ----------------------------------------------------------------------------------


def create_accounts(db: str) -> None:
    """The accounts table on alias ``db``, account 1 at :data:`START`; PostgreSQL's slow COMMIT."""
    with connections[db].cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE {ACCOUNTS} (id integer PRIMARY KEY, balance integer NOT NULL)"
        )
        cursor.execute(f"INSERT INTO {ACCOUNTS} (id, balance) VALUES (1, %s)", [START])
        if connections[db].vendor == "postgresql":
            for statement in slow_commit_sql(ACCOUNTS, SLOW_COMMIT):
                cursor.execute(statement)
            # A COMMIT fails when it would leave a balance below zero.
            cursor.execute(
                "CREATE FUNCTION rlock_no_overdraft() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN IF NEW.balance < 0 THEN RAISE EXCEPTION 'overdraft' "
                "USING ERRCODE = 'check_violation'; END IF; RETURN NULL; END $$"
            )
            cursor.execute(
                f"CREATE CONSTRAINT TRIGGER rlock_no_overdraft AFTER UPDATE ON {ACCOUNTS} "
                "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION rlock_no_overdraft()"
            )


def drop_accounts(db: str) -> None:
    with connections[db].cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {ACCOUNTS}")
        if connections[db].vendor == "postgresql":
            cursor.execute("DROP FUNCTION IF EXISTS rlock_no_overdraft()")
            cursor.execute(f"DROP FUNCTION IF EXISTS {ACCOUNTS}_slow_commit()")


@pytest.fixture
def accounts(postgres_server: PostgresServer) -> Iterator[None]:
    """The accounts table on "pg" and on "default" (in-memory SQLite), dropped after the test."""
    for db in ("pg", "default"):
        create_accounts(db)
    yield
    for db in ("pg", "default"):
        drop_accounts(db)


@pytest.fixture
def slow_sqlite_commits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each COMMIT on SQLite in this process first sleeps :data:`SLOW_COMMIT` seconds."""
    commit = SQLiteWrapper.commit

    def slow_commit(self: SQLiteWrapper) -> None:
        time.sleep(SLOW_COMMIT)
        commit(self)

    monkeypatch.setattr(SQLiteWrapper, "commit", slow_commit)


@contextmanager
def wsgi_workers(count: int, config: dict[str, Any]) -> Iterator[list[int]]:
    """``count`` worker processes serving the test project (tests/django/wsgi_worker.py)."""
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    with ExitStack() as stack:
        workers = [
            stack.enter_context(
                python_module("tests.django.wsgi_worker", json.dumps(config), cwd=ROOT, env=env)
            )
            for _ in range(count)
        ]
        yield [int(read_answer(worker)["port"]) for worker in workers]


def call_concurrently(ports: list[int], path: str, *, clients: int, calls: int) -> Counter[int]:
    """``calls`` GETs of ``path`` by ``clients`` threads, spread over ``ports``; the statuses."""
    statuses: Counter[int] = Counter()
    counted = threading.Lock()
    start = threading.Barrier(clients)

    def client(index: int) -> None:
        start.wait(HANG)
        for call in range(index, calls, clients):
            port = ports[call % len(ports)]
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            try:
                connection.request("GET", path)
                response = connection.getresponse()
                response.read()
                status = response.status
            except OSError:
                status = 0  # no answer at all
            finally:
                connection.close()
            with counted:
                statuses[status] += 1

    threads = [threading.Thread(target=client, args=(index,)) for index in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
        assert not thread.is_alive(), "a client still waits for its answer after 120 s"
    return statuses


def run_on_threads(threads: int, each: int, work: Callable[[], object]) -> list[BaseException]:
    """``work()`` ``each`` times on each of ``threads`` threads at once; the errors raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def run() -> None:
        start.wait(HANG)
        try:
            for _ in range(each):
                try:
                    work()
                except Exception as error:  # noqa: BLE001 -- counted, and shown by the test
                    errors.append(error)
        finally:
            connections.close_all()

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
        assert not worker.is_alive(), "a thread still runs after 120 s"
    return errors


# -- the slow COMMIT itself --------------------------------------------------------------------


@ON_POSTGRES
def test_a_commit_that_wrote_an_account_is_slow(accounts: None) -> None:
    """PostgreSQL's COMMIT of an account's update takes at least :data:`SLOW_COMMIT`."""
    connection = connections["pg"]
    timings = []
    for _ in range(20):
        with transaction.atomic(using="pg"):
            take_one("pg", 1)
            started = time.perf_counter()
        timings.append(time.perf_counter() - started)
    timings.sort()
    print(f"PostgreSQL COMMIT: median {timings[10] * 1000:.2f} ms, min {timings[0] * 1000:.2f} ms")
    assert timings[0] >= SLOW_COMMIT
    assert connection.vendor == "postgresql"


# -- 1. the issue: @locked views under ATOMIC_REQUESTS, three WSGI workers ---------------------


@ON_POSTGRES
def test_locked_view_under_atomic_requests_loses_no_update_on_postgres(
    accounts: None, rlocks: dict[str, Any]
) -> None:
    pg = {**settings_for_child(connections["pg"].settings_dict), "ATOMIC_REQUESTS": True}
    config = {
        "settings": {
            "DATABASES": {
                "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
                "pg": {**pg, "CONN_MAX_AGE": 60},
            },
            "RLOCKS": {"default": rlocks["default"]},
        }
    }
    with wsgi_workers(3, config) as ports:
        statuses = call_concurrently(ports, "/accounts/pg/1/withdraw/", clients=12, calls=120)
    balance = committed_balance("pg")
    lost = balance - (START - statuses[200])
    print(f"PostgreSQL: statuses {dict(statuses)}, {lost} of {statuses[200]} answered updates lost")
    assert statuses == {200: 120}
    assert balance == START - 120


def test_locked_view_under_atomic_requests_loses_no_update_on_sqlite(
    tmp_path: Path, rlocks: dict[str, Any]
) -> None:
    database = tmp_path / "accounts.sqlite3"
    with sqlite3.connect(database) as connection:
        connection.execute(f"CREATE TABLE {ACCOUNTS} (id integer PRIMARY KEY, balance integer)")
        connection.execute(f"INSERT INTO {ACCOUNTS} (id, balance) VALUES (1, ?)", [START])
    connection.close()
    config = {
        "settings": {
            "DATABASES": {
                "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
                "file": {
                    "ENGINE": "django.db.backends.sqlite3",
                    "NAME": str(database),
                    "ATOMIC_REQUESTS": True,
                    "OPTIONS": {"timeout": 30},
                },
            },
            "RLOCKS": {"default": rlocks["default"]},
        },
        "commit_delay": {"file": SLOW_COMMIT},
    }
    with wsgi_workers(3, config) as ports:
        statuses = call_concurrently(ports, "/accounts/file/1/withdraw/", clients=12, calls=120)
    with sqlite3.connect(database) as connection:
        (balance,) = connection.execute(f"SELECT balance FROM {ACCOUNTS} WHERE id = 1").fetchone()
    connection.close()
    print(f"SQLite: statuses {dict(statuses)}, balance {balance} (expected {START - 120})")
    # SQLite refuses a write that overlaps another ("database is locked": a 500)
    # rather than losing it; either way the lock must keep the calls apart.
    assert statuses == {200: 120}
    assert balance == START - 120


# -- 2. a service function: atomic() around rlock() --------------------------------------------


@ON_POSTGRES
@pytest.mark.parametrize("db", ["pg", "default"])
def test_rlock_inside_atomic_loses_no_update(
    accounts: None, slow_sqlite_commits: None, db: str
) -> None:
    errors = run_on_threads(4, 10, lambda: withdraw_service(db))
    balance = committed_balance(db)
    lost = balance - (START - (40 - len(errors)))
    print(f"{db}: {len(errors)} of 40 calls failed, {lost} of the others' updates lost")
    assert errors == []
    assert balance == START - 40


# -- 3. rollback, and a COMMIT that fails ------------------------------------------------------


def free_after(name: str, since: float) -> tuple[bool, float]:
    """Whether another thread took ``name`` at the first attempt, and seconds until it could."""
    first = takes(name)
    if not first:
        wait_for(lambda: takes(name), f"the lock {name!r} free")
    return first, time.monotonic() - since


@ON_POSTGRES
def test_rollback_frees_the_lock_as_atomic_exits(accounts: None) -> None:
    rolled_back = []

    def roll_back() -> None:
        with transaction.atomic(using="pg"):
            with rlock(NAME):
                take_one("pg", 1)
            assert not takes(NAME), "released at the block's end, before the transaction ended"
            rolled_back.append(time.monotonic())
            raise Boom

    with pytest.raises(Boom):
        roll_back()
    first, delay = free_after(NAME, rolled_back[0])
    print(f"free {delay * 1000:.2f} ms after the rollback began (first attempt: {first})")
    assert first, "still held after atomic() rolled back"
    assert delay < HANG
    assert committed_balance("pg") == START


@ON_POSTGRES
def test_a_failed_commit_frees_the_lock(accounts: None) -> None:
    committing = []

    def overdraw() -> None:
        with transaction.atomic(using="pg"):
            with rlock(NAME), connections["pg"].cursor() as cursor:
                cursor.execute(f"UPDATE {ACCOUNTS} SET balance = -1 WHERE id = 1")
            assert not takes(NAME), "released at the block's end, before the transaction ended"
            committing.append(time.monotonic())

    with pytest.raises(IntegrityError, match="overdraft"):
        overdraw()
    first, delay = free_after(NAME, committing[0])
    print(f"free {delay * 1000:.2f} ms after the failed COMMIT began (first attempt: {first})")
    assert first, "still held after the COMMIT failed"
    assert committed_balance("pg") == START


# -- 4. commit ---------------------------------------------------------------------------------


@ON_POSTGRES
@pytest.mark.parametrize("form", ["with rlock", "@locked"])
def test_commit_releases_and_the_next_holder_sees_the_write(accounts: None, form: str) -> None:
    with transaction.atomic(using="pg"):
        if form == "with rlock":
            with rlock(NAME):
                take_one("pg", 1)
        else:
            locked(NAME)(take_one)("pg", 1)
        assert not takes(NAME), "released at the block's end, before COMMIT"
        assert committed_balance("pg") == START

    def next_holder() -> int | None:
        lock = locks["default"].lock(NAME)
        if not lock.acquire(blocking=False):
            return None
        try:
            return committed_balance("pg")
        finally:
            lock.release()

    assert on_another_thread(next_holder) == START - 1


# -- 5. savepoints -----------------------------------------------------------------------------


@ON_POSTGRES
@pytest.mark.parametrize("savepoint", ["commits", "rolls back"])
def test_a_savepoint_ending_keeps_the_lock(accounts: None, savepoint: str) -> None:
    with transaction.atomic(using="pg"):
        try:
            with transaction.atomic(using="pg"):
                with rlock(NAME):
                    take_one("pg", 1)
                assert not takes(NAME)
                if savepoint == "rolls back":
                    raise Boom
        except Boom:
            pass
        assert not takes(NAME), f"released when the savepoint {savepoint.replace('s ', ' ')}"
        take_one("pg", 1)
    assert takes(NAME)
    assert committed_balance("pg") == START - (2 if savepoint == "commits" else 1)


# -- 6. two databases --------------------------------------------------------------------------


@ON_POSTGRES
@pytest.mark.parametrize("first", ["pg", "default"])
def test_two_databases_release_after_the_last_ends(accounts: None, first: str) -> None:
    last = "default" if first == "pg" else "pg"
    with transaction.atomic(using=last):
        with transaction.atomic(using=first):
            with rlock(NAME):
                take_one(first, 1)
                take_one(last, 1)
            assert not takes(NAME)
        assert not takes(NAME), f"released when {first} committed, {last} still open"
    assert takes(NAME)
    assert committed_balance("pg") == committed_balance("default") == START - 1


# -- 7. a hold lost before the block ends ------------------------------------------------------


@ON_POSTGRES
@pytest.mark.parametrize("how", ["force-released", "lease ran out"])
def test_a_lost_hold_fails_the_block_and_nothing_commits(
    accounts: None, settings: SettingsWrapper, rlocks: dict[str, Any], r: redis.Redis, how: str
) -> None:
    # Renewed (and so checked) every third of a second.
    settings.RLOCKS = {**rlocks, "quick": {**rlocks["default"], "WATCHDOG_TIMEOUT": 1}}
    lease = 0.5 if how == "lease ran out" else None

    def write_and_lose() -> None:
        with transaction.atomic(using="pg"):
            with rlock(NAME, using="quick", lease=lease) as lock:
                take_one("pg", 1)
                if how == "force-released":
                    assert on_another_thread(lambda: locks["quick"].lock(NAME).force_release())
                wait_for(lambda: lock.lost, "the hold known lost")
            pytest.fail("the block ended without LockLostError")

    with pytest.raises(LockLostError):
        write_and_lose()
    assert committed_balance("pg") == START


# -- 8. "ignore": released at the block's end --------------------------------------------------


@ON_POSTGRES
@pytest.mark.parametrize("how", ["rlock(transaction=)", "@locked(transaction=)", "the setting"])
def test_ignore_releases_at_the_blocks_end(
    accounts: None, settings: SettingsWrapper, how: str
) -> None:
    with transaction.atomic(using="pg"):
        if how == "rlock(transaction=)":
            with rlock(NAME, transaction="ignore"):
                take_one("pg", 1)
        elif how == "@locked(transaction=)":
            locked(NAME, transaction="ignore")(take_one)("pg", 1)
        else:
            settings.RLOCK_TRANSACTION = "ignore"
            with rlock(NAME):
                take_one("pg", 1)
        assert takes(NAME), "still held after the block ended, with the transaction ignored"


@ON_POSTGRES
def test_the_keyword_wins_over_the_setting(accounts: None, settings: SettingsWrapper) -> None:
    settings.RLOCK_TRANSACTION = "ignore"
    with transaction.atomic(using="pg"):
        with rlock(NAME, transaction="auto"):
            take_one("pg", 1)
        assert not takes(NAME)
    assert takes(NAME)


@ON_POSTGRES
def test_an_explicit_release_is_immediate(accounts: None) -> None:
    with transaction.atomic(using="pg"):
        lock = locks["default"].lock(NAME)
        assert lock.acquire()
        take_one("pg", 1)
        lock.release()
        assert takes(NAME), "an explicit release() waited for the transaction"


# -- 9. the system check -----------------------------------------------------------------------


@pytest.fixture
def atomic_requests() -> Iterator[None]:
    """``ATOMIC_REQUESTS = True`` on the "default" database for this test."""
    database = connections.settings["default"]
    before = database["ATOMIC_REQUESTS"]
    database["ATOMIC_REQUESTS"] = True
    yield
    database["ATOMIC_REQUESTS"] = before


def checked() -> str:
    """What ``manage.py check`` reports (warnings go to stderr)."""
    out, err = StringIO(), StringIO()
    call_command("check", stdout=out, stderr=err)
    return out.getvalue() + err.getvalue()


def test_atomic_requests_with_the_transaction_ignored_warns(
    atomic_requests: None, settings: SettingsWrapper
) -> None:
    settings.RLOCK_TRANSACTION = "ignore"
    report = checked()
    assert "django_rlock.W005" in report
    assert "ATOMIC_REQUESTS" in report


@pytest.mark.parametrize("case", ["auto", "no ATOMIC_REQUESTS"])
def test_no_w005_otherwise(
    settings: SettingsWrapper, request: pytest.FixtureRequest, case: str
) -> None:
    if case == "auto":
        request.getfixturevalue("atomic_requests")
        settings.RLOCK_TRANSACTION = "auto"
    else:
        settings.RLOCK_TRANSACTION = "ignore"
    assert "W005" not in checked()


# -- 10. reentrancy ----------------------------------------------------------------------------


@ON_POSTGRES
def test_reentered_holds_all_end_after_commit(accounts: None) -> None:
    with transaction.atomic(using="pg"):
        with rlock(NAME):
            with rlock(NAME):
                take_one("pg", 1)
            assert not takes(NAME)
            take_one("pg", 1)
        assert not takes(NAME)
    lock = locks["default"].lock(NAME)
    assert lock.hold_count() == 0
    assert not lock.locked(), "the lock's key is still there after COMMIT"
    assert takes(NAME)
    assert committed_balance("pg") == START - 2


# -- async views -------------------------------------------------------------------------------


@ON_POSTGRES
def test_an_async_view_with_its_transaction_inside_the_lock_loses_no_update(accounts: None) -> None:
    """Django has no async atomic(): the view runs its transaction through sync_to_async,
    which commits before ``async with rlock(...)`` ends, so no update is lost."""

    async def calls() -> list[int]:
        client = AsyncClient()
        path = "/accounts/pg/1/withdraw-async/"
        responses = await asyncio.gather(*(client.get(path) for _ in range(30)))
        return [response.status_code for response in responses]

    statuses = asyncio.run(calls())
    assert statuses == [200] * 30
    assert committed_balance("pg") == START - 30


# -- whose connections a block's end reads -----------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_blocks_end_finds_the_connections_django_lists() -> None:
    """The end of every block reads the thread's connections past asgiref's Local (the
    speed of a view's ``with rlock()``): it finds what Django's own listing finds, in
    a thread with a connection, in a thread with none, and in a thread running an
    event loop (which reads through the Local, as Django does)."""

    def both() -> tuple[list[object], list[object]]:
        return list(open_connections()), list(connections.all(initialized_only=True))

    connections["default"].ensure_connection()
    ours, django_s = both()
    assert connections["default"] in ours
    assert ours == django_s
    assert on_another_thread(both) == ([], [])

    async def in_a_loop() -> tuple[list[object], list[object]]:
        return both()

    ours, django_s = asyncio.run(in_a_loop())
    assert ours == django_s
