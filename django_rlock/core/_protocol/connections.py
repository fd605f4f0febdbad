"""What both engines' connections share without I/O: how a URL is shown, what redis-py wants."""

from __future__ import annotations

import inspect
from urllib.parse import urlsplit

import redis


def _requires_command_name() -> bool:
    parameter = inspect.signature(redis.ConnectionPool.get_connection).parameters["command_name"]
    return parameter.default is inspect.Parameter.empty


#: What ``pool.get_connection()`` is called with: redis-py before 5.3 requires a
#: command name (it ignores it); later ones deprecate passing one.
GET_CONNECTION_ARGS: tuple[str, ...] = ("PING",) if _requires_command_name() else ()


def redact_url(url: str) -> str:
    """``url`` fit for messages and logs: no user, no password (also not in the query)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    query = "&".join(
        f"{key}=***" if "password" in key.lower() or key.lower() == "username" else item
        for item in parts.query.split("&")
        if item
        for key in [item.partition("=")[0]]
    )
    return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")
