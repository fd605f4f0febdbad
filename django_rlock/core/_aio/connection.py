"""Redis clients for the asyncio engine, and the sync twin its watchdog renews with.

Renewal runs on the process's one watchdog thread (shared with the sync engine),
so an async client keeps a sync client to the same server for it: renewals then
never touch, or block, the event loop.
"""

from __future__ import annotations

import codecs
import inspect
from typing import Any

import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff

from django_rlock.core._protocol.urls import redact_url


def _requires_command_name() -> bool:
    parameter = inspect.signature(redis.asyncio.ConnectionPool.get_connection).parameters.get(
        "command_name"
    )
    return parameter is not None and parameter.default is inspect.Parameter.empty


#: What ``pool.get_connection()`` is awaited with: redis-py before 5.3 requires a
#: command name (it ignores it); later ones deprecate passing one.
GET_CONNECTION_ARGS: tuple[str, ...] = ("PING",) if _requires_command_name() else ()

_SYNC_CONNECTION_CLASSES: dict[str, type[Any]] = {
    "Connection": redis.Connection,
    "SSLConnection": redis.SSLConnection,
    "UnixDomainSocketConnection": redis.UnixDomainSocketConnection,
}


def connect_async(connection: str | redis.asyncio.Redis) -> tuple[redis.asyncio.Redis, bool]:
    """Return ``(client, owned)`` for a redis URL or an existing ``redis.asyncio.Redis``."""
    if isinstance(connection, str):
        if not connection:
            raise ValueError("connection must be a redis URL or a redis.asyncio.Redis, got ''")
        try:
            # Blocking: hundreds of tasks may contend at once, and each should
            # wait for a free connection rather than fail with "Too many connections".
            pool = redis.asyncio.BlockingConnectionPool.from_url(connection, timeout=None)
            return redis.asyncio.Redis(connection_pool=pool), True
        except ValueError as error:
            raise ValueError(f"invalid redis URL {redact_url(connection)!r}: {error}") from None
    if isinstance(connection, redis.asyncio.Redis):
        return connection, False
    raise ValueError(
        f"connection must be a redis URL or a redis.asyncio.Redis, not {type(connection).__name__}"
    )


def _settings(pool: Any) -> dict[str, Any]:
    return {
        key: value
        for key, value in pool.connection_kwargs.items()
        # State a pool attaches to its own connections, not connection settings.
        if not key.startswith(("orig_", "maint_notifications_pool"))
    }


def derive_async_pool(
    client: redis.asyncio.Redis, **overrides: Any
) -> redis.asyncio.ConnectionPool:
    """A new async pool to ``client``'s server with retries off and ``overrides`` applied."""
    pool = client.connection_pool
    kwargs = _settings(pool)
    kwargs.update(retry=AsyncRetry(NoBackoff(), 0), decode_responses=False, **overrides)
    return redis.asyncio.ConnectionPool(connection_class=pool.connection_class, **kwargs)


#: The connection classes whose sockets the lean command path may take over
#: (``_aio/wire.py``): redis-py's own, exactly; a subclass may do more on its socket.
_LEAN_CONNECTION_CLASSES = (
    redis.asyncio.Connection,
    redis.asyncio.SSLConnection,
    redis.asyncio.UnixDomainSocketConnection,
)


def lean_connection(client: redis.asyncio.Redis) -> Any:
    """A new, unconnected connection to ``client``'s server for the lean path, or None.

    None when its connections are not redis-py's own classes, or encode text
    other than as UTF-8 (the lean path packs keys as UTF-8, as redis-py's
    default encoder does): the lean path must write the very keys redis-py would.
    """
    pool = client.connection_pool
    if pool.connection_class not in _LEAN_CONNECTION_CLASSES:
        return None
    kwargs = _settings(pool)
    try:
        if codecs.lookup(kwargs.get("encoding") or "utf-8").name != "utf-8":
            return None
    except LookupError:
        return None
    return pool.connection_class(**kwargs)


def sync_twin(client: redis.asyncio.Redis) -> redis.Redis:
    """A sync client to the same server as ``client`` (used only for renewal)."""
    pool = client.connection_pool
    connection_class = _SYNC_CONNECTION_CLASSES.get(pool.connection_class.__name__)
    if connection_class is None:
        raise ValueError(
            f"cannot renew locks over a {pool.connection_class.__name__}: use a redis URL"
        )
    return redis.Redis(
        connection_pool=redis.ConnectionPool(connection_class=connection_class, **_settings(pool))
    )
