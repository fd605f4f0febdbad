"""One worker process serving the test project, as a web server's sync worker would.

Run as ``python -m tests.django.wsgi_worker CONFIG``, CONFIG a JSON object:
``asgi`` (true: serve the ASGI application with uvicorn, one event loop, as
an ASGI deployment does; else WSGI, one request at a time),
``settings`` (what to change in tests/django_settings.py: ``DATABASES``,
``RLOCKS``, ...) and ``commit_delay`` (``{alias: seconds}``: each COMMIT on
that SQLite alias waits that long first, as a slow disk would; PostgreSQL's
slow COMMIT is the database's own, see tests/postgres.py). It binds a free
port on 127.0.0.1, prints ``{"port": N}`` and serves one request at a time
until it is killed.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import django
from django.conf import settings


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class Server(WSGIServer):
    #: Every client of a test may connect at once; the rest wait in the backlog.
    request_queue_size = 128


def delay_sqlite_commits(delays: dict[str, float]) -> None:
    """Each COMMIT on the SQLite aliases of ``delays`` first waits its number of seconds."""
    from django.db.backends.base.base import BaseDatabaseWrapper  # noqa: PLC0415
    from django.db.backends.sqlite3.base import DatabaseWrapper  # noqa: PLC0415

    commit = DatabaseWrapper.commit

    def slow_commit(self: BaseDatabaseWrapper) -> None:
        time.sleep(delays.get(self.alias, 0.0))
        commit(self)

    DatabaseWrapper.commit = slow_commit  # type: ignore[method-assign]


def main(config: dict[str, Any]) -> None:
    from tests import django_settings  # noqa: PLC0415

    base = {name: getattr(django_settings, name) for name in dir(django_settings) if name.isupper()}
    settings.configure(**{**base, **config.get("settings", {})})
    django.setup()
    from django.core.wsgi import get_wsgi_application  # noqa: PLC0415 -- after setup()

    delay_sqlite_commits(config.get("commit_delay", {}))
    if config.get("asgi"):
        serve_asgi()
        return
    server = make_server(
        "127.0.0.1", 0, get_wsgi_application(), server_class=Server, handler_class=QuietHandler
    )
    print(json.dumps({"port": server.server_port}), flush=True)
    server.serve_forever()


def serve_asgi() -> None:
    """Serve the ASGI application with uvicorn on a free port of 127.0.0.1, printed first."""
    import socket  # noqa: PLC0415

    import uvicorn  # noqa: PLC0415 -- only the ASGI tests need it
    from django.core.asgi import get_asgi_application  # noqa: PLC0415 -- after setup()

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(128)  # before the port is told: a client may connect at once
    print(json.dumps({"port": listening.getsockname()[1]}), flush=True)
    config = uvicorn.Config(get_asgi_application(), log_level="warning", lifespan="off")
    uvicorn.Server(config).run(sockets=[listening])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
