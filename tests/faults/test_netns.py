"""Fault 2, kernel variant: a partition made by taking a network namespace's loopback down.

Needs root and ``unshare -n`` (Linux); skipped otherwise, saying which is missing.
The scenario runs in a child process inside the namespace (tests/faults/netns_scenario.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.faults.conftest import TIMEOUT

pytestmark = pytest.mark.faults


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (unshare -n makes a network namespace)"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs unshare and ip (util-linux, iproute2)"
    probe = subprocess.run(["unshare", "-n", "true"], check=False, capture_output=True, timeout=10)
    if probe.returncode != 0:
        return f"unshare -n is refused here: {probe.stderr.decode().strip()}"
    return None


def test_partition_by_network_namespace() -> None:
    reason = _why_not()
    if reason is not None:
        pytest.skip(reason)
    run = subprocess.run(
        ["unshare", "-n", sys.executable, "-m", "tests.faults.netns_scenario"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout.strip().splitlines()[-1])
    print(f"FIGURES netns: {report}")
    assert report["told"] and report["release"] == "LockLostError"
    assert report["late_by"] <= 0.1  # told by its deadline (scheduling aside)
    assert report["longest_renewal"] <= TIMEOUT / 6 + 0.1
