"""Without Redisson's emulator, ``make test`` passes on a user's clone and fails under CI.

Each test runs pytest in a subprocess on one interop test that needs the
emulator, with the locator pointed at a folder that does not exist
(``REDISSON_EMULATOR_DIR``) and no server allowed to start: the answer must
come before any server is needed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.pure

#: The checkout (or nox's staged copy) whose tests/interop is run.
ROOT = Path(__file__).resolve().parents[2]

#: One interop test that needs the emulator (through the ``redisson`` fixture).
NEEDS_EMULATOR = "tests/interop/test_lock.py::test_a_java_hold_keeps_python_out_and_python_sees_it"


def run_without_emulator(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["REDISSON_EMULATOR_DIR"] = str(tmp_path / "not-here")
    env["RLOCK_TEST_NO_SERVERS"] = "1"  # tests/servers.py: starting one fails the test
    env.pop("CI", None)
    if ci is not None:
        env["CI"] = ci
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist"]
    return subprocess.run(
        [*command, NEEDS_EMULATOR],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("ci", [None, "false"])
def test_outside_ci_the_tests_skip_saying_what_is_missing(tmp_path: Path, ci: str | None) -> None:
    run = run_without_emulator(tmp_path, ci)

    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 skipped" in run.stdout
    # Said beside the skip (-ra) and again in a section of its own at the end.
    assert run.stdout.count("redisson_emulator.py") >= 2, run.stdout
    assert "Redisson interop tests skipped" in run.stdout
    assert str(tmp_path / "not-here") in run.stdout
    assert "Set REDISSON_EMULATOR_DIR" in run.stdout


def test_under_ci_a_missing_emulator_fails(tmp_path: Path) -> None:
    run = run_without_emulator(tmp_path, "true")

    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 error" in run.stdout
    assert "CI must run the interop tests" in run.stdout
    assert str(tmp_path / "not-here") in run.stdout
