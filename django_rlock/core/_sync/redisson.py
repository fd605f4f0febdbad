"""The threaded engine's lock in Redisson's layout: shared with Java services' RLock.

``LockClient(url, layout="redisson").lock(name)`` makes one. It is the engine's
:class:`~django_rlock.core._sync.locks.RLock` (acquiring, waiting, releasing,
the watchdog, ``lost``, ``token``...) sending the calls of
:class:`~django_rlock.core._protocol.redisson.RedissonBase` to Redisson's keys;
the protocol, and what is shared with Redisson, is in
:mod:`django_rlock.core._protocol.redisson`. The asyncio twin is in
``_aio/redisson.py``.
"""

from __future__ import annotations

from django_rlock.core._protocol.lock import KindScripts
from django_rlock.core._protocol.redisson import RedissonBase, RedissonScripts, nothing_to_leave
from django_rlock.core._sync.locks import RLock


class RedissonRLock(RedissonBase, RLock):
    """An :class:`RLock` that a Java service's Redisson ``RLock`` of the same name shares."""

    def _kind_scripts(self) -> KindScripts:
        scripts = self.client.scripts[RedissonScripts]
        return KindScripts(
            scripts.acquire, scripts.release, nothing_to_leave, scripts.force_release
        )
