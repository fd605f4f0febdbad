"""Without Redisson's emulator, ``make test`` passes on a user's clone and fails under CI.

Each test runs pytest in a subprocess on one interop test that needs the
emulator, with the locator pointed at a folder that does not exist
(``REDISSON_EMULATOR_DIR``) and no server allowed to start: the answer must
come before any server is needed. The three runs are started together, and in
a run of one process (``make test-fast``) as soon as collection ends
(tests/interop/conftest.py), so that they go on beside the other tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.pure

#: The checkout (or nox's staged copy) whose tests/interop is run.
ROOT = Path(__file__).resolve().parents[2]

#: One interop test that needs the emulator (through the ``redisson`` fixture).
NEEDS_EMULATOR = "tests/interop/test_lock.py::test_a_java_hold_keeps_python_out_and_python_sees_it"


#: The ``CI`` values the tests run under (``None``: unset).
CI_VALUES = (None, "false", "true")


@dataclass(frozen=True)
class Run:
    """One pytest run without the emulator: what it printed and how it ended."""

    returncode: int
    stdout: str
    stderr: str
    missing: Path


#: The runs started when collection ended, if they were (see :func:`start_runs`).
EARLY_RUNS = pytest.StashKey[dict[str | None, tuple[subprocess.Popen[str], Path]]]()


def start_runs() -> dict[str | None, tuple[subprocess.Popen[str], Path]]:
    """One run per ``CI`` value, started together; each told an emulator folder never made."""
    missing_under = Path(tempfile.gettempdir(), f"rlock-locator-{uuid.uuid4().hex}")
    started: dict[str | None, tuple[subprocess.Popen[str], Path]] = {}
    try:
        for index, ci in enumerate(CI_VALUES):
            missing = missing_under / str(index) / "not-here"
            started[ci] = (start_without_emulator(missing, ci), missing)
    except BaseException:
        stop_runs(started)
        raise
    return started


def stop_runs(started: dict[str | None, tuple[subprocess.Popen[str], Path]]) -> None:
    """End the runs still going (a run whose results were never read)."""
    for process, _ in started.values():
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest) -> dict[str | None, Run]:
    """The runs under every ``CI`` value (each is a pytest start-up), as they ended."""
    started = request.config.stash.get(EARLY_RUNS, None) or start_runs()
    try:
        done: dict[str | None, Run] = {}
        for ci, (process, missing) in started.items():
            stdout, stderr = process.communicate(timeout=120)
            done[ci] = Run(process.returncode, stdout, stderr, missing)
        return done
    finally:
        stop_runs(started)


def start_without_emulator(missing: Path, ci: str | None) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env["REDISSON_EMULATOR_DIR"] = str(missing)
    env["RLOCK_TEST_NO_SERVERS"] = "1"  # tests/servers.py: starting one fails the test
    env.pop("CI", None)
    if ci is not None:
        env["CI"] = ci
    # The locator's answer needs neither Django's settings (pytest-django sets
    # them up at start) nor Hypothesis' plugin: without them a start-up costs
    # half as much (0.7 s of CPU instead of 1.3 s).
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist"]
    command += ["-p", "no:django", "-p", "no:hypothesispytest"]
    return subprocess.Popen(
        [*command, NEEDS_EMULATOR],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("ci", [None, "false"])
def test_outside_ci_the_tests_skip_saying_what_is_missing(
    runs: dict[str | None, Run], ci: str | None
) -> None:
    run = runs[ci]

    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 skipped" in run.stdout
    # Said beside the skip (-ra) and again in a section of its own at the end.
    assert run.stdout.count("redisson_emulator.py") >= 2, run.stdout
    assert "Redisson interop tests skipped" in run.stdout
    assert str(run.missing) in run.stdout
    assert "Set REDISSON_EMULATOR_DIR" in run.stdout


def test_under_ci_a_missing_emulator_fails(runs: dict[str | None, Run]) -> None:
    run = runs["true"]

    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 error" in run.stdout
    assert "CI must run the interop tests" in run.stdout
    assert str(run.missing) in run.stdout
