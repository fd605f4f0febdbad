"""``make demo``'s driver, in its quick mode: every check green, everything stopped.

It runs as ``make demo`` does on a machine without Redis: on the embedded
redis-server, with a real Celery worker (prefork, 2 processes) and the Django
development server, all started and stopped by the driver.
"""

from __future__ import annotations

import html
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.example.conftest import PROJECT_DIR, PYTHON, project_env

pytestmark = pytest.mark.slow

#: The checks of the report, by label: all must be there, and all green.
EXPECTED_CHECKS = [
    "HTTP requests answered",
    "409 Conflict answers (refund busy)",
    "capture tasks run / retried",
    "report tasks run / retried",
    "lock renewals (report locks)",
    "killed task's lock freed after",
    "paused holder's stale write",
    "mutual-exclusion violations",
    "order balances consistent",
    "timeline picture",
    "processes left running",
]


def started_pids(output: str) -> list[int]:
    """The pids of the Redis, worker and server the demo said it started."""
    return [int(pid) for pid in re.findall(r"\bpid (\d+)", output)]


def gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        pass
    else:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_quick_demo_passes_every_check(tmp_path: Path) -> None:
    report_file = tmp_path / "report.json"
    pictures = tmp_path / "timeline"
    done = subprocess.run(
        [PYTHON, "-m", "demo", "--quick", "--json", str(report_file), "--timeline", str(pictures)],
        cwd=PROJECT_DIR,
        env=project_env(),
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    output = done.stdout + done.stderr

    assert done.returncode == 0, output
    report: dict[str, Any] = json.loads(report_file.read_text())
    checks = {check["label"]: check for check in report["checks"]}
    assert list(checks) == EXPECTED_CHECKS
    assert all(check["ok"] for check in checks.values()), output
    assert "all checks passed" in output
    # The numbers behind the green marks.
    plan = report["plan"]
    assert report["http"]["errors"] == 0 and report["http"]["by_status"]["409"] > 0
    assert report["tasks"]["succeeded"] == report["tasks"]["sent"] > 0
    assert report["tasks"]["retries"] > 0
    assert report["reports"]["succeeded"] == report["reports"]["queued"] == 4
    assert report["reports"]["killed_run_finished"]
    assert report["renewals"] > 0 and report["longest_hold"] >= 3 * plan["watchdog"]
    assert 0 < report["kill"]["freed_after"] <= plan["watchdog"] + 0.5
    assert report["pause"]["refused"] and report["pause"]["release_raised"] == "LockLostError"
    assert report["violations"] == [] and report["inconsistent_orders"] == []
    assert report["orders"] == 12 and report["left_running"] == []
    pids = started_pids(done.stdout)
    assert len(pids) >= 3 and all(gone(pid) for pid in pids)
    check_timeline(report, pictures, done.stdout)


def check_timeline(report: dict[str, Any], directory: Path, output: str) -> None:
    """The picture shows what the run recorded: its holders, the kill, the pause, the renewals."""
    svg_file, html_file = directory / "demo-timeline.svg", directory / "demo-timeline.html"
    assert report["picture"]["svg"] == str(svg_file.resolve())
    assert f"timeline: {svg_file.resolve()}" in output  # printed under the table
    svg, page = svg_file.read_text(), html_file.read_text()
    assert svg[svg.index("<svg") :] in page  # the page embeds the very picture
    grants = report["timeline"]["grants"]
    kill, pause = report["kill"], report["pause"]
    killed = next(g for g in grants if g["token"] == kill["token"])
    labels = {mark["kind"]: mark["label"] for mark in killed["marks"]}
    assert labels["sigkill"] == f"SIGKILL pid {kill['pid']}"
    assert labels["freed"] == f"freed +{kill['freed_after']:.2f}s"
    paused = next(g for g in grants if g["token"] == pause["token"])
    labels = {mark["kind"]: mark["label"] for mark in paused["marks"]}
    assert labels["refused"] == f"write refused (token {pause['token']})"
    assert labels["lost"] == "release(): LockLostError"
    for label in [*labels.values(), f"SIGKILL pid {kill['pid']}"]:
        assert f">{label}<" in svg and html.escape(label) in page
    # One lane per holder, named: each report run by its worker process and task id.
    for grant in grants:
        assert f"{grant['lock']}  {html.escape(grant['holder'])}" in svg
    assert sum(1 for g in grants if g["holder"].startswith("worker pid ")) == 5
    assert any(g["token"] == pause["overtaken_by"] for g in grants)
    renewals = sum(1 for g in grants for mark in g["marks"] if mark["kind"] == "renewal")
    assert renewals == report["renewals"] == report["picture"]["renewals"]


def test_ctrl_c_stops_everything_the_demo_started() -> None:
    demo = subprocess.Popen(
        [PYTHON, "-m", "demo", "--quick"],
        cwd=PROJECT_DIR,
        env=project_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert demo.stdout is not None
    seen = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = demo.stdout.readline()
            if not line:
                break
            seen.append(line)
            if "driving for" in line:
                break
        assert "driving for" in seen[-1], "".join(seen)
        time.sleep(1)  # under load, tasks running
        demo.send_signal(signal.SIGINT)
        rest, _ = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(10)
    output = "".join(seen) + rest

    assert demo.returncode == 130, output
    assert "interrupted: stopping everything" in output
    pids = started_pids(output)
    assert len(pids) == 3, output
    assert all(gone(pid) for pid in pids), output
