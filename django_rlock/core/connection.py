"""Building the Redis clients the engine uses next to the caller's own.

The caller's client runs acquire, release and inspection, with whatever retry
policy the caller chose. Two paths need different rules and get their own
connections, derived from the caller's connection settings:

* renewal: no hidden retries and a short socket timeout, so no renewal can
  block past the deadline at which its lock must be declared lost;
* pub/sub: a dedicated connection whose reads belong to one dispatcher thread.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = ["connect", "derive_pool", "describe"]


def connect(connection: str | redis.Redis) -> tuple[redis.Redis, bool]:
    """Return ``(client, owned)`` for a redis URL or an existing client.

    ``owned`` tells whether the engine built the client (and must close it).
    """
    if isinstance(connection, str):
        if not connection:
            raise ValueError("connection must be a redis URL or a redis.Redis, got ''")
        try:
            return redis.Redis.from_url(connection), True
        except ValueError as error:
            raise ValueError(f"invalid redis URL {connection!r}: {error}") from None
    if isinstance(connection, redis.Redis):
        return connection, False
    raise ValueError(
        f"connection must be a redis URL or a redis.Redis, not {type(connection).__name__}"
    )


def derive_pool(client: redis.Redis, **overrides: Any) -> redis.ConnectionPool:
    """A new pool to the same server as ``client``, with ``overrides`` applied.

    Retries are always switched off: a derived connection reports the first
    error to the engine, which decides what to do by its own deadlines.
    """
    pool = client.connection_pool
    kwargs = {
        key: value
        for key, value in pool.connection_kwargs.items()
        # State a pool attaches to its own connections, not connection settings.
        if not key.startswith(("orig_", "maint_notifications_pool"))
    }
    kwargs.update(
        retry=Retry(NoBackoff(), 0),
        retry_on_timeout=False,
        retry_on_error=[],
        decode_responses=False,
        **overrides,
    )
    return redis.ConnectionPool(connection_class=pool.connection_class, **kwargs)


def describe(client: redis.Redis) -> str:
    """The server a client talks to, for error messages (never credentials)."""
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix:{kwargs['path']}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
