"""What a view answers when its lock is lost, or its release fails, after its work.

The answer tells the truth about the view's work: its own response when the
work was done (with ``X-Lock-Release: lost`` or ``failed`` saying what
became of the lock), a 503 saying so when the work was rolled back, and
never a bare 500. Before, ``@locked`` let the release's error replace the
view's response (a 500, or a 503 from LockErrorMiddleware, for work that was
done), and the middleware let a lost lock through as a 500.

The views (tests/django/answer_views.py) write a row, then the test breaks
their lock: a force-release (an operator's, from the admin page or
``rlock_locks --force-release``), or the lock server stopped.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection, connections
from django.test import AsyncClient, Client
from prometheus_client import REGISTRY
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock import locks
from django_rlock.exceptions import LockLostError
from django_rlock.signals import lock_lost
from tests.django import answer_views as views
from tests.django.conftest import HANG
from tests.servers import RedisServer

pytestmark = pytest.mark.urls("tests.django.answer_urls")

MIDDLEWARE = "django_rlock.middleware.LockErrorMiddleware"
HEADER = "X-Lock-Release"


@pytest.fixture(autouse=True)
def _no_hook() -> Iterator[None]:
    yield
    views.during_work = None


@pytest.fixture(params=[False, True], ids=["without-middleware", "with-middleware"])
def middleware(request: pytest.FixtureRequest, settings: SettingsWrapper) -> bool:
    if request.param:
        settings.MIDDLEWARE = [*settings.MIDDLEWARE, MIDDLEWARE]
    return bool(request.param)


@pytest.fixture
def notes(transactional_db: None) -> Iterator[None]:
    """The views' table on the default database (SQLite), dropped after the test."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE {views.NOTES} (id integer PRIMARY KEY AUTOINCREMENT, text text)"
        )
    yield
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {views.NOTES}")


@pytest.fixture
def atomic_requests(notes: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ATOMIC_REQUESTS = True`` on the default database: Django commits after the view."""
    monkeypatch.setitem(connections["default"].settings_dict, "ATOMIC_REQUESTS", True)


def written() -> list[str]:
    """The notes committed (and those of the calling thread's open transaction)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT text FROM {views.NOTES} ORDER BY id")
        return [row[0] for row in cursor.fetchall()]


def force_release(name: str) -> None:
    """An operator force-releases lock ``name`` while the view holds it."""
    assert locks["default"].force_release(name)


def force_release_and_wait_until_told(name: str) -> None:
    """Force-release ``name``, then wait until the holder knows (its watchdog's next renewal)."""
    told = threading.Event()

    def on_lost(sender: object, **signal: Any) -> None:
        if signal["name"] == name:
            told.set()

    lock_lost.connect(on_lost, weak=False)
    try:
        force_release(name)
        assert told.wait(HANG), "the watchdog never told the holder its lock was lost"
    finally:
        lock_lost.disconnect(on_lost)


@pytest.fixture
def losses() -> Iterator[list[str]]:
    """The names the ``lock_lost`` signal was sent for during the test."""
    names: list[str] = []

    def on_lost(sender: object, **signal: Any) -> None:
        names.append(signal["name"])

    lock_lost.connect(on_lost, weak=False)
    yield names
    lock_lost.disconnect(on_lost)


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + HANG
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not after {HANG} s"
        time.sleep(0.01)


def client() -> Client:
    """A test client that answers a view's error as Django does (500), instead of raising it."""
    return Client(raise_request_exception=False)


def errors_logged(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(
        record.getMessage()
        for record in caplog.records
        if record.levelno >= logging.ERROR and record.name == "django_rlock.lock"
    )


# -- the work was done: the view's own response, and a header ------------------------------


@pytest.mark.usefixtures("middleware", "notes")
def test_a_lock_force_released_during_the_view_answers_the_views_response(
    caplog: pytest.LogCaptureFixture, losses: list[str], settings: SettingsWrapper
) -> None:
    settings.RLOCK_METRICS = "prometheus"
    labels = {"alias": "default", "lock": "note:{note}"}
    lost_before = REGISTRY.get_sample_value("django_rlock_lost_total", labels) or 0.0
    views.during_work = force_release
    with caplog.at_level(logging.ERROR, logger="django_rlock.lock"):
        response = client().post("/note/a/")
    assert (response.status_code, response.content) == (201, b"noted a")
    assert response[HEADER] == "lost"
    assert written() == ["a"]
    assert "'note:a'" in errors_logged(caplog) and "lost" in errors_logged(caplog)
    # The loss is told on a thread of its own: wait (bounded) until it has been.
    wait_for(lambda: bool(losses), "the lock_lost signal")
    wait_for(
        lambda: REGISTRY.get_sample_value("django_rlock_lost_total", labels) == lost_before + 1,
        "django_rlock_lost_total counted the loss",
    )
    assert losses == ["note:a"]


@pytest.fixture
def own_server(settings: SettingsWrapper, rlocks: dict[str, Any]) -> Iterator[RedisServer]:
    """RLOCKS['own'] on a redis-server of this test's own, which the test may stop."""
    with RedisServer() as server:
        settings.RLOCKS = {**rlocks, "own": {"LOCATION": server.url, "WATCHDOG_TIMEOUT": 5}}
        yield server


@pytest.mark.usefixtures("middleware")
def test_a_release_that_cannot_reach_the_server_answers_the_views_response(
    own_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    views.during_work = lambda name: own_server.stop()
    with caplog.at_level(logging.ERROR, logger="django_rlock.lock"):
        response = client().post("/own/b/")
    assert (response.status_code, response.content) == (201, b"noted b")
    assert response[HEADER] == "failed"
    assert "'note:b'" in errors_logged(caplog)


def test_a_view_that_raises_keeps_its_own_error(caplog: pytest.LogCaptureFixture) -> None:
    views.during_work = force_release
    with (
        caplog.at_level(logging.ERROR, logger="django_rlock.lock"),
        pytest.raises(ValueError, match="the view's own failure"),
    ):
        Client().post("/failing/c/")
    assert "'note:c'" in errors_logged(caplog)


@pytest.mark.usefixtures("middleware")
def test_an_async_view_answers_its_own_response() -> None:
    views.during_work = force_release

    async def call() -> Any:
        return await asyncio.wait_for(
            AsyncClient(raise_request_exception=False).post("/async/d/"), HANG
        )

    response = asyncio.run(call())
    assert (response.status_code, response.content) == (201, b"noted d")
    assert response[HEADER] == "lost"


# -- under ATOMIC_REQUESTS: the transaction decides -------------------------------------------


@pytest.mark.usefixtures("middleware", "atomic_requests")
def test_a_loss_known_before_the_commit_rolls_back_and_answers_503(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The view's changes are not committed yet: they are rolled back, and the answer says so."""
    views.during_work = force_release_and_wait_until_told
    with caplog.at_level(logging.ERROR, logger="django_rlock.lock"):
        response = client().post("/note/e/")
    assert response.status_code == 503
    assert response[HEADER] == "lost"
    assert response["Retry-After"] == "5"
    assert b"rolled back" in response.content and b"note" not in response.content
    assert written() == []
    assert "'note:e'" in errors_logged(caplog)


@pytest.mark.usefixtures("atomic_requests")
def test_busy_response_raise_lets_the_loss_roll_back_and_reach_django() -> None:
    views.during_work = force_release_and_wait_until_told
    with pytest.raises(LockLostError):
        Client().post("/note-or-raise/f/")
    assert written() == []


@pytest.mark.usefixtures("middleware", "atomic_requests")
def test_a_loss_found_at_the_release_after_commit_keeps_the_views_response(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The release after COMMIT finds the loss: the work is committed, the answer says done.

    Django commits before the response leaves its handler, so the header can
    still say what the release found. Should the watchdog tell the loss
    before the view returns (a loaded machine), the view's changes are
    rolled back and it answers 503: either way the status tells the truth
    about the work.
    """
    views.during_work = force_release
    with caplog.at_level(logging.ERROR, logger="django_rlock.lock"):
        response = client().post("/note/g/")
    assert response.status_code in (201, 503)
    assert written() == (["g"] if response.status_code == 201 else [])
    assert response[HEADER] == "lost"
    assert "'note:g'" in errors_logged(caplog)


# -- LockErrorMiddleware: a lock lost in ``with rlock()`` ---------------------------------------


@pytest.mark.parametrize("path", ["/with-rlock/h/", "/async-with-rlock/h/"])
def test_the_middleware_answers_a_lost_lock_503_not_500(
    path: str, settings: SettingsWrapper, caplog: pytest.LogCaptureFixture
) -> None:
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, MIDDLEWARE]
    views.during_work = force_release
    response: Any
    with caplog.at_level(logging.ERROR, logger="django_rlock.lock"):
        if path.startswith("/async"):
            response = asyncio.run(AsyncClient(raise_request_exception=False).post(path))
        else:
            response = client().post(path)
    assert response.status_code == 503
    assert response[HEADER] == "lost"
    assert response["Retry-After"] == "5"
    assert b"note" not in response.content
    assert "'note:h'" in errors_logged(caplog)


def test_without_the_middleware_a_lost_lock_reaches_django() -> None:
    views.during_work = force_release
    with pytest.raises(LockLostError):
        Client().post("/with-rlock/i/")
