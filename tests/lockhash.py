"""Reading a lock's hash as the tests check it: the owners' hold counts only."""

from __future__ import annotations

import redis

from django_rlock.core._process.holder import is_holder_field


def owner_counts(client: redis.Redis, key: str) -> dict[str, int]:
    """Owner id -> hold count in the lock hash ``key``, without the holder's description."""
    fields = {
        (name.decode() if isinstance(name, bytes) else name): value
        for name, value in client.hgetall(key).items()
    }
    return {name: int(value) for name, value in fields.items() if not is_holder_field(name)}
