"""What the demo prints while it runs: event lines, and one progress line on a terminal."""

from __future__ import annotations

import logging
import sys
import threading
import time


class Console:
    """Timestamped output shared by every thread of the demo."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.tty = sys.stdout.isatty()
        self.status = ""
        self.mutex = threading.Lock()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def say(self, text: str) -> None:
        """One event line (above the progress line on a terminal)."""
        with self.mutex:
            if self.tty:
                sys.stdout.write("\r\033[K")
            sys.stdout.write(f"{self.elapsed():6.1f}s  {text}\n")
            if self.tty and self.status:
                sys.stdout.write(self.status)
            sys.stdout.flush()

    def progress(self, text: str) -> None:
        """Replace the progress line (a new line each time when not on a terminal)."""
        with self.mutex:
            self.status = f"{self.elapsed():6.1f}s  {text}"
            sys.stdout.write(f"\r\033[K{self.status}" if self.tty else f"{self.status}\n")
            sys.stdout.flush()

    def end_progress(self) -> None:
        with self.mutex:
            if self.tty and self.status:
                sys.stdout.write("\n")
            self.status = ""


class ConsoleLog(logging.Handler):
    """Log records as event lines: what the library logs in the demo's process (a lost lock...)."""

    def __init__(self, console: Console) -> None:
        super().__init__()
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        self.console.say(f"log {record.levelname} {record.name}: {record.getMessage()}")
