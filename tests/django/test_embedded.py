"""The embedded backend's one-server rule, with real processes and real redis-servers.

Every process using one ``LOCATION`` must talk to the same redis-server, however
many start at the same instant, or the locks exclude nothing; and the server must
stop once no process uses it. Servers are found with psutil: a redis-server runs
in the directory of its database file, and each test has a directory of its own.
"""

from __future__ import annotations

import os
import re
import selectors
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock import locks
from django_rlock.backends.embedded import EmbeddedServerError
from django_rlock.exceptions import LockSettingError

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
HANG = 60.0  # seconds: only ever reached when something hangs
PROCESSES = 8
INCREMENTS = 40


def servers_in(directory: Path) -> list[psutil.Process]:
    """The redis-server processes running in ``directory`` (their database's)."""
    found = []
    for process in psutil.process_iter(["name"]):
        try:
            if process.info["name"] == "redis-server" and Path(process.cwd()) == directory:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def wait_for_no_server_in(directory: Path) -> list[psutil.Process]:
    """Wait (bounded) until no redis-server runs in ``directory``; those still running."""
    deadline = time.monotonic() + HANG
    left = servers_in(directory)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = servers_in(directory)
    return left


class User:
    """A process using the embedded backend (tests/django/embedded_user.py)."""

    def __init__(self, location: Path, increments: int = INCREMENTS) -> None:
        env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.django.embedded_user", str(location), str(increments)],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def send(self, word: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(word + "\n")
        self.process.stdin.flush()

    def expect(self, word: str) -> list[str]:
        """The words of the next line, which must start with ``word``."""
        assert self.process.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            assert selector.select(HANG), f"no {word!r} from pid {self.process.pid}"
        words = self.process.stdout.readline().split()
        assert words[:1] == [word], f"pid {self.process.pid} said {words}, not {word!r}"
        return words[1:]

    def counted(self) -> tuple[int, str]:
        """The counter and the server's run_id, as this process reads them."""
        self.send("check")
        count, run_id = self.expect("counted")
        return int(count), run_id

    def exit(self) -> None:
        self.send("exit")
        assert self.process.wait(HANG) == 0

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(HANG)


@pytest.fixture
def users(tmp_path: Path) -> Iterator[list[User]]:
    """The test's user processes; any still running at the end is killed, and so is
    any server left in the test's directory (its failure is reported by the test)."""
    started: list[User] = []
    yield started
    for user in started:
        if user.process.poll() is None:
            user.kill()
    for server in wait_for_no_server_in(tmp_path):
        server.kill()


def test_processes_starting_together_share_one_server_and_exclude_each_other(
    tmp_path: Path, users: list[User]
) -> None:
    location = tmp_path / "locks.rdb"
    users += [User(location) for _ in range(PROCESSES)]
    for user in users:
        user.expect("ready")
    for user in users:  # all reach the backend for the first time together
        user.send("go")
    for user in users:
        user.expect("done")
    counted = [user.counted() for user in users]

    assert {count for count, _ in counted} == {PROCESSES * INCREMENTS}
    assert len({run_id for _, run_id in counted}) == 1
    assert len(servers_in(tmp_path)) == 1
    for user in users:
        user.exit()
    assert wait_for_no_server_in(tmp_path) == []


def test_the_server_outlives_its_starter_and_stops_after_its_last_user(
    tmp_path: Path, users: list[User]
) -> None:
    location = tmp_path / "locks.rdb"
    starter = User(location)
    users.append(starter)
    starter.expect("ready")
    starter.send("go")
    starter.expect("done")
    joiner = User(location)
    users.append(joiner)
    joiner.expect("ready")
    joiner.send("go")
    joiner.expect("done")
    _, run_id = starter.counted()
    starter.exit()

    assert joiner.counted() == (2 * INCREMENTS, run_id)
    assert len(servers_in(tmp_path)) == 1
    joiner.exit()
    assert wait_for_no_server_in(tmp_path) == []


def test_a_server_whose_users_were_all_killed_stops(tmp_path: Path, users: list[User]) -> None:
    location = tmp_path / "locks.rdb"
    users += [User(location) for _ in range(2)]
    for user in users:
        user.expect("ready")
        user.send("go")
        user.expect("done")
    assert len(servers_in(tmp_path)) == 1
    for user in users:
        user.kill()  # no exit hook runs

    assert wait_for_no_server_in(tmp_path) == []


def test_a_crashed_server_is_replaced_by_the_next_user(tmp_path: Path, users: list[User]) -> None:
    location = tmp_path / "locks.rdb"
    first = User(location)
    users.append(first)
    first.expect("ready")
    first.send("go")
    first.expect("done")
    _, crashed_run_id = first.counted()
    (server,) = servers_in(tmp_path)
    # Everything around the server dies at once (an OOM kill, a power cut): nothing
    # removes its socket and pid file.
    guardians = [
        parent
        for parent in server.parents()[:1]
        if any("_embedded_guardian" in part for part in parent.cmdline())
    ]
    for process in [*guardians, server]:
        process.kill()
    first.kill()
    psutil.wait_procs([server], timeout=HANG)

    second = User(location)
    users.append(second)
    second.expect("ready")
    second.send("go")
    second.expect("done")
    count, run_id = second.counted()

    assert run_id != crashed_run_id
    assert count >= INCREMENTS
    second.exit()
    assert wait_for_no_server_in(tmp_path) == []


EMBEDDED = "django_rlock.backends.embedded.EmbeddedRedisLockBackend"


@pytest.mark.parametrize(
    ("location", "message"),
    [
        ("redis://127.0.0.1:6379/0", "must be the path of its database file, got 'redis://"),
        (42, "must be the path of its database file, got 42"),
        ("{tmp}/missing/locks.rdb", "the directory '{tmp}/missing' does not exist"),
        ("{tmp}", "must be the path of its database file, got the directory '{tmp}'"),
    ],
)
def test_a_bad_location_is_refused_clearly(
    settings: SettingsWrapper,
    rlocks: dict[str, Any],
    tmp_path: Path,
    location: object,
    message: str,
) -> None:
    if isinstance(location, str):
        location = location.format(tmp=tmp_path)
    settings.RLOCKS = {**rlocks, "bad": {"BACKEND": EMBEDDED, "LOCATION": location}}

    with pytest.raises(LockSettingError, match=re.escape(message.format(tmp=tmp_path))):
        locks["bad"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"serverconfig": "maxmemory 1mb"}, "['serverconfig'] must be a dict of redis.conf"),
        ({"no_such_keyword": 1}, "unknown key 'no_such_keyword'"),
    ],
)
def test_bad_options_are_refused_before_any_server_starts(
    settings: SettingsWrapper,
    rlocks: dict[str, Any],
    tmp_path: Path,
    options: dict[str, object],
    message: str,
) -> None:
    settings.RLOCKS = {
        **rlocks,
        "bad": {"BACKEND": EMBEDDED, "LOCATION": str(tmp_path / "locks.rdb"), "OPTIONS": options},
    }

    with pytest.raises(LockSettingError, match=re.escape(message)):
        locks["bad"].lock("x").locked()
    assert servers_in(tmp_path) == []


def test_a_server_that_cannot_start_says_why_and_leaves_nothing_running(
    settings: SettingsWrapper, rlocks: dict[str, Any], tmp_path: Path
) -> None:
    settings.RLOCKS = {
        **rlocks,
        "bad": {
            "BACKEND": EMBEDDED,
            "LOCATION": str(tmp_path / "locks.rdb"),
            "OPTIONS": {"serverconfig": {"no-such-directive": "1"}},
        },
    }

    with pytest.raises(
        EmbeddedServerError, match=r"RLOCKS\['bad'\]: .*did not start(.|\n)*no-such-directive"
    ):
        locks["bad"].lock("x").locked()
    assert servers_in(tmp_path) == []
    # Nothing half-held: the alias works once its settings do.
    settings.RLOCKS = {
        **rlocks,
        "bad": {"BACKEND": EMBEDDED, "LOCATION": str(tmp_path / "locks.rdb")},
    }
    assert locks["bad"].lock("x").acquire(blocking=False)
    locks["bad"].lock("x").release()
    locks.close_all()
    assert wait_for_no_server_in(tmp_path) == []
