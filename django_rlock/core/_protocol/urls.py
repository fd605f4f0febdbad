"""How a server's URL is shown in messages and logs, by both engines: without its credentials."""

from __future__ import annotations

from urllib.parse import urlsplit


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
