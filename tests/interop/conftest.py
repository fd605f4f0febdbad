"""The peer of the interop tests: emulated Redisson clients running Redisson's own scripts.

The emulator lives outside this repository, in ``../shared/redisson`` of the
checkout (its README: ``redisson_emulator.py``, Redisson's Lua copied
verbatim, its client behaviour mirrored method by method). It is imported
from there, never copied into the package or the wheel. It is looked for, in
this order:

1. the environment variable ``REDISSON_EMULATOR_DIR`` (noxfile.py sets it
   when it finds the emulator, as the suite runs from a staged copy); when
   it is set, there only: a directory named on purpose is not second-guessed;
2. ``<checkout>/../shared/redisson``, the checkout being ``RLOCK_SOURCE_TREE``
   (set by noxfile.py) or the one this file is in;
3. ``<origin>/../shared/redisson``, ``<origin>`` being the local directory the
   checkout was cloned from (CI runs a fresh clone placed anywhere: its
   ``origin`` is this repository's path).

If it is in none of them, the tests that need it are SKIPPED outside CI (a
user's clone of the public repository has no emulator: ``make test`` must
pass there), each saying what is missing and where it was looked for, and the
run ends with a section that says so again. Under CI (``CI`` set, and not
``false``/``0``) they FAIL instead: a missing peer must not pass for a passing
interop suite where the interop suite is meant to run.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis

EMULATOR = "redisson_emulator.py"


def _origin_of(checkout: Path) -> Path | None:
    """The local directory ``checkout`` was cloned from, if its ``origin`` is one."""
    try:
        found = subprocess.run(
            ["git", "-C", str(checkout), "remote", "get-url", "origin"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    url = found.stdout.strip()
    if found.returncode != 0 or not url:
        return None
    url = url.removeprefix("file://")
    if "://" in url or (":" in url.split("/", 1)[0] and not url.startswith("/")):
        return None  # a remote URL (https://, ssh://, host:path): no directory here
    origin = Path(url)
    if not origin.is_absolute():
        origin = (checkout / origin).resolve()
    return origin


def candidates() -> list[tuple[str, Path]]:
    """Where the emulator may be, in the order above, each with where the idea came from."""
    found: list[tuple[str, Path]] = []
    chosen = os.environ.get("REDISSON_EMULATOR_DIR")
    if chosen:
        return [("REDISSON_EMULATOR_DIR", Path(chosen))]
    checkouts: list[tuple[str, Path]] = []
    source = os.environ.get("RLOCK_SOURCE_TREE")
    if source:
        checkouts.append(("RLOCK_SOURCE_TREE", Path(source)))
    checkouts.append(("this test file's checkout", Path(__file__).resolve().parents[2]))
    for what, checkout in checkouts:
        found.append((f"beside {what}", checkout.parent / "shared" / "redisson"))
    for what, checkout in checkouts:
        origin = _origin_of(checkout)
        if origin is not None:
            found.append((f"beside the origin of {what}", origin.parent / "shared" / "redisson"))
    return found


def locate() -> tuple[Path | None, str]:
    """The emulator's directory (None when missing), and where it was looked for."""
    looked = []
    for what, directory in candidates():
        if (directory / EMULATOR).is_file():
            return directory, ""
        looked.append(f"{directory} ({what})")
    return None, "; ".join(looked)


EMULATOR_DIR, LOOKED = locate()

#: What is missing, said by every test that needs the emulator when it is not found.
MISSING = (
    f"Redisson's emulated peer ({EMULATOR}, kept in ../shared/redisson beside this team's "
    f"checkouts, not in the repository) was not found: looked in {LOOKED}. "
    "Set REDISSON_EMULATOR_DIR to its directory to run the Redisson interop tests."
)

#: The number of tests skipped for want of the emulator (for the run's closing section).
_skipped_for_emulator = pytest.StashKey[int]()


def in_ci() -> bool:
    """Whether this run is CI's (``CI`` set to anything but empty, ``0``, ``false`` or ``no``)."""
    return os.environ.get("CI", "").strip().lower() not in {"", "0", "false", "no"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Outside CI, without the emulator, skip the tests that need it before any server starts."""
    if EMULATOR_DIR is not None or in_ci():
        return
    skip = pytest.mark.skip(reason=MISSING)
    skipped = 0
    for item in items:
        if "emu" in getattr(item, "fixturenames", ()):
            item.add_marker(skip)
            skipped += 1
    config.stash[_skipped_for_emulator] = skipped


def pytest_collection_finish(session: pytest.Session) -> None:
    """In a run of one process, start test_locator.py's pytest runs now, beside the others.

    Each is a pytest start-up (about a second of CPU): begun when the locator's
    tests came up, ``make test-fast`` waited for them. Their tests move to the
    end, so that the runs have the whole session to finish. Under xdist every
    worker collects every test but runs only some: there they start when used.
    """
    config = session.config
    if hasattr(config, "workerinput") or config.option.collectonly:
        return
    locator = [item for item in session.items if item.nodeid.startswith(LOCATOR_TESTS)]
    if not locator:
        return
    session.items[:] = [i for i in session.items if i not in locator] + locator
    from tests.interop import test_locator  # noqa: PLC0415 -- collected, so imported already

    started = test_locator.start_runs()
    config.stash[test_locator.EARLY_RUNS] = started
    config.add_cleanup(lambda: test_locator.stop_runs(started))


#: The node ids of the tests that run pytest without the emulator.
LOCATOR_TESTS = "tests/interop/test_locator.py::"


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Say once more, at the end where it is seen, that the interop tests did not run."""
    skipped = config.stash.get(_skipped_for_emulator, 0)
    if skipped:
        terminalreporter.section("Redisson interop tests skipped", sep="!", yellow=True)
        terminalreporter.line(f"{skipped} tests did not run. {MISSING}", yellow=True)


@pytest.fixture(scope="session")
def emu() -> ModuleType:
    """The emulator module (``emu.RedissonClient``...); see the module for when it is missing."""
    if EMULATOR_DIR is None:
        # Outside CI these tests were skipped at collection; here a test is in CI.
        pytest.fail(f"{MISSING} (CI must run the interop tests)", pytrace=False)
    if str(EMULATOR_DIR) not in sys.path:
        sys.path.insert(0, str(EMULATOR_DIR))
    return importlib.import_module("redisson_emulator")


def server_major(client: redis.Redis) -> int:
    """The major version of the server ``client`` talks to."""
    version = str(client.info("server")["redis_version"])
    return int(version.split(".", 1)[0])


def skip_without_sharded_pubsub(client: redis.Redis) -> None:
    """Skip, naming the server's version, when it has no SPUBLISH/SSUBSCRIBE (Redis < 7).

    Asked of the server itself: any other failure fails the test.
    """
    version = str(client.info("server")["redis_version"])
    if int(version.split(".", 1)[0]) < 7:
        pytest.skip(
            f"redis-server {version} has no sharded pub/sub (SPUBLISH/SSUBSCRIBE came in "
            "Redis 7): Redisson then publishes with PUBLISH, tested beside this"
        )


class JavaSide:
    """Makes emulated Redisson instances; each has its own UUID, pub/sub connection and watchdog."""

    def __init__(self, emu: ModuleType, url: str) -> None:
        self.emu = emu
        self.url = url
        self.made: list[Any] = []

    def __call__(
        self,
        *,
        watchdog: float = 3.0,
        publish_command: str = "publish",
        url: str | None = None,
        label: str | None = None,
    ) -> Any:
        config = self.emu.RedissonConfig(
            lock_watchdog_timeout_ms=int(watchdog * 1000), publish_command=publish_command
        )
        client = self.emu.RedissonClient(
            url or self.url, config, label=label or f"java-{len(self.made)}"
        )
        self.made.append(client)
        return client

    def close(self) -> list[tuple[str, bytes]]:
        """Shut every instance down; the messages Redisson could not decode."""
        undecodable = [error for client in self.made for error in client.decode_errors]
        for client in self.made:
            if not client.closed:  # a test may have "killed" one already
                client.shutdown()
        return undecodable


@pytest.fixture
def redisson(emu: ModuleType, redis_url: str, r: redis.Redis) -> Iterator[Callable[..., Any]]:
    """``redisson(watchdog=3.0, publish_command="publish")``: a new emulated Redisson instance.

    On the test server, emptied (``r``). Afterwards, no message that a Java
    side received may have been undecodable: Redisson drops such a message,
    and its waiters sleep to the holder's TTL.
    """
    java = JavaSide(emu, redis_url)
    yield java
    undecodable = java.close()
    assert not undecodable, f"Redisson could not decode: {undecodable}"
