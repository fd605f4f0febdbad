"""A private PostgreSQL cluster for the tests, on a free loopback port.

Uses Debian's server binaries (``/usr/lib/postgresql/<version>/bin``, the
newest version there, else ``initdb`` and ``postgres`` on PATH; or the
directory ``RLOCK_TEST_POSTGRES_BIN`` names): ``initdb``
into a fresh temporary directory, then ``postgres`` listening on 127.0.0.1
only, its unix socket inside that directory, ``fsync`` off (the data is thrown
away). PostgreSQL refuses to run as root: as root, the directory is handed to
the ``postgres`` user (which Debian's package creates) and both programs run
as that user. :meth:`PostgresServer.stop` ends the server (a fast shutdown)
and removes the directory.

:func:`slow_commit_sql` makes every COMMIT that wrote a row of a table
several milliseconds slower (a deferred constraint trigger sleeps at COMMIT):
a managed database's COMMIT, the window in which a lock released before it
lets the next holder read what is about to be overwritten.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.servers import PORT_ATTEMPTS, PortTaken, forbid_servers, free_port, port_in_use

__all__ = [
    "PostgresServer",
    "PostgresUnavailable",
    "postgres_bin_dir",
    "settings_for_child",
    "slow_commit_sql",
]

#: The database superuser the cluster is made with (trust authentication, loopback only).
SUPERUSER = "postgres"


class PostgresUnavailable(RuntimeError):
    """PostgreSQL's server programs, or a user allowed to run them, are missing here."""


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", path.parent.parent.name))


def postgres_bin_dir() -> Path:
    """The directory holding ``initdb`` and ``postgres`` (raises PostgresUnavailable).

    ``RLOCK_TEST_POSTGRES_BIN`` names it when set (another version or build).
    """
    chosen = os.environ.get("RLOCK_TEST_POSTGRES_BIN")
    if chosen:
        if not all(os.access(Path(chosen, name), os.X_OK) for name in ("initdb", "postgres")):
            raise PostgresUnavailable(
                f"RLOCK_TEST_POSTGRES_BIN={chosen!r} has no initdb and postgres"
            )
        return Path(chosen)
    installed = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=_version_key)
    if installed:
        return installed[-1].parent
    found = shutil.which("initdb")
    if found and shutil.which("postgres"):
        return Path(found).parent
    raise PostgresUnavailable(
        "PostgreSQL's server is not installed (apt-get install postgresql): "
        "no /usr/lib/postgresql/*/bin/initdb and no initdb on PATH"
    )


def _run_as() -> dict[str, Any]:
    """Popen's arguments that run a server program as a user allowed to (not root)."""
    if os.geteuid() != 0:
        return {}
    try:
        user = pwd.getpwnam(SUPERUSER)
    except KeyError:
        raise PostgresUnavailable(
            "running as root and there is no 'postgres' user to run PostgreSQL as "
            "(Debian's postgresql package creates it)"
        ) from None
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


class PostgresServer:
    """One PostgreSQL cluster on 127.0.0.1, made, started and removed by the tests."""

    def __init__(self, *, port: int | None = None) -> None:
        self.bin_dir = postgres_bin_dir()
        self.run_as = _run_as()
        #: The port was chosen here: it may move if another process takes it first.
        self.movable = port is None
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="rlock-pg-"))
        self.data = self.dir / "data"
        self.process: subprocess.Popen[bytes] | None = None

    def django_settings(self, name: str = "rlock") -> dict[str, Any]:
        """A ``DATABASES`` entry for database ``name`` of this cluster (psycopg 3)."""
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": SUPERUSER,
            "HOST": "127.0.0.1",
            "PORT": str(self.port),
        }

    def connect(self, dbname: str = "postgres", **kwargs: Any) -> Any:
        """A psycopg connection to database ``dbname`` (autocommit unless told otherwise)."""
        import psycopg  # noqa: PLC0415 -- only where PostgreSQL runs

        kwargs.setdefault("autocommit", True)
        return psycopg.connect(
            host="127.0.0.1", port=self.port, user=SUPERUSER, dbname=dbname, **kwargs
        )

    def start(self, timeout: float = 30.0) -> PostgresServer:
        """Make the cluster and start its server; RuntimeError when it cannot.

        A port chosen here that another process takes first (another pytest
        worker's cluster, say) moves to a fresh one, as a RedisServer's does.
        """
        forbid_servers("a PostgreSQL server")
        if self.run_as:
            os.chown(self.dir, self.run_as["user"], self.run_as["group"])
        initdb = subprocess.run(
            [
                str(self.bin_dir / "initdb"),
                "--pgdata", str(self.data),
                "--username", SUPERUSER,
                "--auth", "trust",
                "--encoding", "UTF8",
                "--no-locale",
                "--no-sync",
            ],
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            **self.run_as,
        )  # fmt: skip
        if initdb.returncode:
            raise RuntimeError(f"initdb failed: {initdb.stderr.decode(errors='replace')}")
        for _ in range(PORT_ATTEMPTS - 1):
            try:
                return self._launch(timeout)
            except PortTaken:
                if not self.movable:
                    raise
                self.port = free_port()
        return self._launch(timeout)

    def _launch(self, timeout: float) -> PostgresServer:
        log = open(self.dir / "postgres.log", "wb")  # noqa: SIM115 -- the server's, closed below
        with log:
            self.process = subprocess.Popen(
                [
                    str(self.bin_dir / "postgres"),
                    "-D", str(self.data),
                    "-p", str(self.port),
                    "-c", "listen_addresses=127.0.0.1",
                    "-c", f"unix_socket_directories={self.dir}",
                    "-c", "fsync=off",
                    "-c", "full_page_writes=off",
                    "-c", "max_connections=200",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                **self.run_as,
            )  # fmt: skip
        import psycopg  # noqa: PLC0415 -- only where PostgreSQL runs

        deadline = time.monotonic() + timeout
        while True:
            try:
                with self.connect(connect_timeout=2) as probe:
                    row = probe.execute("SELECT current_setting('data_directory')").fetchone()
                break
            except psycopg.OperationalError:
                exited = self.process.poll() is not None
                if exited or time.monotonic() > deadline:
                    self.stop()
                    if exited and port_in_use(self.port):
                        raise PortTaken(f"port {self.port} is taken") from None
                    raise RuntimeError(
                        f"PostgreSQL did not start on port {self.port}:\n{self.log_tail()}"
                    ) from None
                time.sleep(0.05)
        if row is None or Path(row[0]).resolve() != self.data.resolve():
            # Another cluster had the port (its data directory is not ours).
            self.stop()
            raise PortTaken(f"port {self.port} answers for another PostgreSQL cluster")
        self.movable = False
        return self

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = (self.dir / "postgres.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """A fast shutdown: open sessions are ended, nothing is waited for."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None

    def __enter__(self) -> PostgresServer:
        try:
            return self.start()
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def slow_commit_sql(table: str, seconds: float = 0.004) -> list[str]:
    """Statements that make each COMMIT writing rows of ``table`` sleep ``seconds`` per row.

    A constraint trigger, DEFERRABLE INITIALLY DEFERRED, runs at COMMIT: the
    transaction's locks and snapshot stay as they are until it returns, as
    while a managed database's COMMIT travels to its disk and its replica.
    """
    function = f"{table}_slow_commit"
    return [
        f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS "
        f"$$ BEGIN PERFORM pg_sleep({seconds}); RETURN NULL; END $$",
        f"DROP TRIGGER IF EXISTS {function} ON {table}",
        f"CREATE CONSTRAINT TRIGGER {function} AFTER INSERT OR UPDATE ON {table} "
        f"DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {function}()",
    ]


def settings_for_child(settings_dict: Mapping[str, Any]) -> dict[str, Any]:
    """The connection keys of a Django ``DATABASES`` entry, for another process."""
    keys = ("ENGINE", "NAME", "USER", "PASSWORD", "HOST", "PORT", "OPTIONS")
    return {key: settings_dict[key] for key in keys if key in settings_dict}
