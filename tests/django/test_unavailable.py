"""Lock server unreachable, seen from Django: the alias is named, views answer 503.

``default`` points at a loopback port nothing listens on (connection refused
at once), with a password in its URL that must never be shown.
"""

from __future__ import annotations

import asyncio
import io
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import AsyncClient, Client
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock import LockUnavailableError, locked, locks, rlock
from tests.servers import free_port

PASSWORD = "pw-not-shown"
HANG = 60.0
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def unreachable(settings: SettingsWrapper, rlocks: dict[str, Any]) -> str:
    """RLOCKS['default'] on a port nothing listens on; returns that URL without the password."""
    port = free_port()
    settings.RLOCKS = {
        **rlocks,
        "default": {"LOCATION": f"redis://:{PASSWORD}@127.0.0.1:{port}/0", "KEY_PREFIX": "t"},
    }
    return f"redis://***@127.0.0.1:{port}/0"


def test_lock_calls_raise_lock_unavailable_naming_the_alias(unreachable: str) -> None:
    lock = locks["default"].lock("order:1")
    for call in (lock.acquire, lock.locked, lock.ttl, lambda: rlock("order:1").__enter__()):
        with pytest.raises(LockUnavailableError) as caught:
            call()
        message = str(caught.value)
        assert "RLOCKS['default']" in message and unreachable in message
        assert "'order:1'" in message and PASSWORD not in message
    with pytest.raises(LockUnavailableError, match=r"cannot list locks: .*RLOCKS\['default'\]"):
        list(locks["default"].names())


def test_locked_view_answers_503_with_retry_after_and_does_not_run(
    unreachable: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="django_rlock.lock"):
        response = Client().get("/quick/5/")
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert b"order" not in response.content and b"127.0.0.1" not in response.content
    assert "RLOCKS['default']" in caplog.text and PASSWORD not in caplog.text
    assert Client().get("/cbv/5/").status_code == 503


def test_async_locked_view_answers_503(unreachable: str) -> None:
    async def scenario() -> Any:
        return await asyncio.wait_for(AsyncClient().get("/async/3/"), HANG)

    response = asyncio.run(scenario())
    assert response.status_code == 503 and response["Retry-After"] == "5"


def test_busy_response_raise_and_plain_functions_let_the_error_through(
    unreachable: str,
) -> None:
    with pytest.raises(LockUnavailableError):
        Client().get("/quick-raise/5/")

    @locked("job:{n}")
    def job(n: int) -> int:
        return n

    with pytest.raises(LockUnavailableError, match=r"RLOCKS\['default'\]"):
        job(1)


@pytest.mark.parametrize(
    "args", [("list",), ("inspect", "order:1"), ("release", "order:1", "--force", "--yes")]
)
def test_command_prints_one_clear_line(unreachable: str, args: tuple[str, ...]) -> None:
    with pytest.raises(CommandError) as caught:
        call_command("rlock", *args, stdout=io.StringIO())
    message = str(caught.value)
    assert "\n" not in message
    assert "unreachable" in message and "RLOCKS['default']" in message
    assert PASSWORD not in message


def test_command_in_a_real_process_prints_no_traceback() -> None:
    """tests/django_settings.py points ``default`` at port 1: nothing listens there."""
    result = subprocess.run(
        [sys.executable, "-m", "django", "rlock", "list", "--settings=tests.django_settings"],
        capture_output=True,
        text=True,
        timeout=HANG,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("CommandError: cannot list locks: the lock server RLOCKS['default']")
    assert "Traceback" not in result.stderr
