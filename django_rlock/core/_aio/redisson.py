"""The asyncio engine's lock in Redisson's layout: the twin of ``_sync/redisson.py``.

``AsyncLockClient(url, layout="redisson").lock(name)`` makes one: the engine's
:class:`~django_rlock.core._aio.locks.AsyncRLock` sending the calls of
:class:`~django_rlock.core._protocol.redisson.RedissonBase` to Redisson's keys
(:mod:`django_rlock.core._protocol.redisson`). Its owner is the current task,
``<process UUID>:task-<number>``: Redisson never reads an owner field, only
compares it (a Java tool that parses the thread id as a number would stop
at the ``task-``).
"""

from __future__ import annotations

from django_rlock.core._aio.locks import AsyncRLock
from django_rlock.core._protocol.lock import KindScripts
from django_rlock.core._protocol.redisson import RedissonBase, RedissonScripts, nothing_to_leave


class AsyncRedissonRLock(RedissonBase, AsyncRLock):
    """An :class:`AsyncRLock` that a Java service's Redisson ``RLock`` of the same name shares."""

    def _kind_scripts(self) -> KindScripts:
        scripts = self.client.scripts[RedissonScripts]
        return KindScripts(
            scripts.acquire, scripts.release, nothing_to_leave, scripts.force_release
        )

    async def _abandon(self, waiter_id: str) -> None:
        """Nothing to leave: no waiter registers in this layout (see ``nothing_to_leave``)."""
