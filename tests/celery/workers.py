"""A real ``celery worker`` process on the test Redis, started and stopped by tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType

from tests.celery.app import app

ROOT = Path(__file__).resolve().parents[2]


class Worker:
    """``celery -A tests.celery.app worker --pool=prefork --concurrency=2`` in a subprocess."""

    def __init__(
        self,
        broker_url: str,
        *,
        watchdog_timeout: float = 1.0,
        concurrency: int = 2,
        pool: str = "prefork",
        queue: str = "celery",
        env: dict[str, str] | None = None,
        app_module: str = "tests.celery.app",
    ) -> None:
        """``queue``: what it consumes (a test's own worker takes a queue of its own,
        so the package's shared worker never runs that test's tasks)."""
        self.nodename = f"rlock-{uuid.uuid4().hex[:8]}@localhost"
        self.log = Path(tempfile.mkstemp(prefix="rlock-worker-", suffix=".log")[1])
        # Celery-only unless the test asks for Django: pytest-django exports
        # DJANGO_SETTINGS_MODULE, and Celery's Django fixup would pick it up.
        inherited = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        self.env = {
            **inherited,
            "RLOCK_TEST_BROKER_URL": broker_url,
            "RLOCK_TEST_WATCHDOG_TIMEOUT": str(watchdog_timeout),
            "PYTHONPATH": str(ROOT),
            **(env or {}),
        }
        self.args = [
            sys.executable, "-m", "celery", "-A", app_module, "worker",
            f"--pool={pool}", f"--concurrency={concurrency}", "--loglevel=INFO",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
            "--prefetch-multiplier=1", "-n", self.nodename, "-Q", queue,
        ]  # fmt: skip
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *, wait_ready: bool = True, timeout: float = 60.0) -> Worker:
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                self.args, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        if wait_ready:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"worker exited at start:\n{self.output()}")
            if app.control.ping(destination=[self.nodename], timeout=0.5):
                return
        raise RuntimeError(f"worker not ready within {timeout}s:\n{self.output()}")

    def wait_exit(self, timeout: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)  # warm shutdown
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        self.process = None

    def __enter__(self) -> Worker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
        self.log.unlink(missing_ok=True)
