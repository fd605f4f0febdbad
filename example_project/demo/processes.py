"""The processes the demo starts: each in a session of its own, always stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Managed:
    """A child process with its output in a log file, stopped with its whole group.

    It runs in a session of its own: Ctrl-C in the terminal reaches only the
    demo, which then stops its children in order (the worker warmly first).
    """

    def __init__(self, name: str, args: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        with log.open("wb") as output:
            self.process = subprocess.Popen(
                args,
                cwd=PROJECT_DIR,
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self, grace: float) -> None:
        """SIGTERM, up to ``grace`` seconds to exit, then SIGKILL to the whole group."""
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=grace)
        # Whatever is left of the group (a prefork child of a killed worker...).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        # A killed member whose parent is gone stays in the group until init
        # reaps it, which some inits do late: wait, so "left running" is true.
        deadline = time.monotonic() + 10
        while self.group_alive() and time.monotonic() < deadline:
            time.sleep(0.05)

    def group_alive(self) -> bool:
        """Whether any process of this child's group still runs."""
        try:
            os.killpg(self.process.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # pragma: no cover -- a reused group id of someone else's
            return False
        return True


def python() -> str:
    return sys.executable


def start_worker(env: dict[str, str], log: Path, nodename: str, queue: str) -> Managed:
    args = [
        python(), "-m", "celery", "-A", "shop", "worker",
        "--pool=prefork", "--concurrency=2", "--loglevel=INFO",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
        "-n", nodename, "-Q", queue,
    ]  # fmt: skip
    return Managed("celery worker", args, env, log)


def start_server(env: dict[str, str], log: Path, port: int) -> Managed:
    args = [python(), "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"]
    return Managed("django server", args, env, log)


def wait_http(url: str, process: Managed, timeout: float) -> None:
    """Wait until ``url`` answers (any HTTP status); fail if ``process`` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process.running():
            raise RuntimeError(f"{process.name} exited at start:\n{process.tail()}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{process.name} did not answer within {timeout}s:\n{process.tail()}")
