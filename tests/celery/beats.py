"""Real ``celery beat`` and ``celery worker`` processes of tests/celery/beat_app.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

ROOT = Path(__file__).resolve().parents[2]

#: The longest a process may take to start or stop (only reached when one hangs).
HANG = 30.0


class CeleryProcess:
    """``celery -A tests.celery.beat_app <command>`` in a directory of its own, logged to a file."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="rlock-beat-"))
        self.log = self.dir / "log"
        # Celery-only unless the test says otherwise: pytest-django exports
        # DJANGO_SETTINGS_MODULE, which Celery's Django fixup would pick up.
        inherited = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        self.env = {**inherited, "PYTHONPATH": str(ROOT), **env}
        self.args = [sys.executable, "-m", "celery", "-A", "tests.celery.beat_app", *command]
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> CeleryProcess:
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                self.args, cwd=self.dir, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        return self

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_for_output(self, text: str, timeout: float = HANG) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if not self.alive():
                raise RuntimeError(f"{self.args[5]} exited:\n{self.output()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {text!r} within {timeout}s:\n{self.output()}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: the process dies at once, releasing nothing."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=HANG)

    def stop(self) -> int:
        """SIGTERM, and the exit code (killed if it does not stop in time)."""
        process = self.process
        if process is None or process.poll() is not None:
            return 0 if process is None else process.returncode
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout=HANG)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=HANG)
            raise

    def __enter__(self) -> CeleryProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.alive():
            assert self.process is not None
            self.process.kill()
            self.process.wait(timeout=HANG)
        if exc_type is not None:  # shown by pytest with the failure
            print(f"---- {' '.join(self.args[3:])} (pid {self.pid}):\n{self.output()}")


def beat(env: dict[str, str]) -> CeleryProcess:
    """An elected beat (its schedule file in its own directory)."""
    return CeleryProcess(
        ["beat", "-S", "celery_rlock.beat:ElectedScheduler", "--loglevel=INFO"], env
    )


def worker(env: dict[str, str], queue: str) -> CeleryProcess:
    """One solo worker consuming ``queue``."""
    return CeleryProcess(
        [
            "worker", "--pool=solo", "--loglevel=INFO", "-Q", queue, "-n", "beat-tests@localhost",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ],
        env,
    )  # fmt: skip
