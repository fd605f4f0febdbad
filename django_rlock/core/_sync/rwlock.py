"""ReadWriteLock: many readers or one writer (Redisson's RReadWriteLock).

Get one from :meth:`LockClient.read_write_lock`; ``.read`` and ``.write`` each
have the :class:`~django_rlock.core.RLock` API::

    report = client.read_write_lock("report:42")
    with report.read:                 # many threads and processes at once
        serve(cached_report())
    with report.write:                # alone: waits for the readers to leave
        rebuild_report(fence=report.write.token)

Each side is reentrant per owner (thread), renewed by the watchdog
(``lease=None``) or given a fixed lease, and waits by pub/sub as a lock does.
The writer may also read (its read holds are granted while it writes); a
reader asking to write gets :class:`LockUpgradeError` at once, since its own
read hold would keep the write lock from it forever. Write grants carry a
fencing token (strictly increasing, as a lock's); read holds carry token 0.
The keys, scripts and wake-up rules are in :mod:`django_rlock.core._protocol.rwlock`.
"""

from __future__ import annotations

from typing import Unpack

from django_rlock.core._protocol.calls import hold_count_reply, ttl_reply
from django_rlock.core._protocol.lock import LockOptions
from django_rlock.core._protocol.rwlock import ReadSide, ReadWriteBase, RWScripts, WriteSide
from django_rlock.core._sync.locks import RLock
from django_rlock.core._sync.shell import Client


class WriteLock(WriteSide, RLock):
    """The write side of a :class:`ReadWriteLock`: one owner at a time, and no reader.

    Get it as ``client.read_write_lock(name).write``.
    """


class ReadLock(ReadSide, RLock):
    """The read side of a :class:`ReadWriteLock`: many owners at once, while nobody else writes.

    Get it as ``client.read_write_lock(name).read``. ``locked()`` and ``ttl()``
    are about every reader: whether any reader holds it, and when the
    longest-lived one's hold ends. A read hold's ``token`` is 0 (fencing
    tokens order writers).
    """

    def _readers(self) -> tuple[int, int]:
        call = self._readers_call()
        with self._reachable("inspect"):
            live, longest = self._scripts.readers(keys=call.keys, args=call.args)
        return int(live), int(longest)

    def locked(self) -> bool:
        """True when any owner holds a read."""
        return self._readers()[0] > 0

    def ttl(self) -> float | None:
        """Seconds until the longest-lived read hold expires, None when nobody reads."""
        return ttl_reply(self._readers()[1])

    def owned(self) -> bool:
        """True when the calling thread holds a read (asks Redis)."""
        owner = self._owner()
        with self._reachable("inspect"):
            return bool(self.client.redis.hexists(self.rw_keys.reader(owner), owner))

    def hold_count(self) -> int:
        """How many read holds the calling thread has (0 when none; asks Redis)."""
        owner = self._owner()
        with self._reachable("inspect"):
            return hold_count_reply(self.client.redis.hget(self.rw_keys.reader(owner), owner))


class ReadWriteLock(ReadWriteBase):
    """Many readers or one writer; get one from :meth:`LockClient.read_write_lock`.

    ``read`` and ``write`` are locks with the :class:`~django_rlock.core.RLock`
    API (see :mod:`django_rlock.core._protocol.rwlock`). One object may be shared by
    many threads, each its own owner.
    """

    def __init__(self, client: Client, name: str, **options: Unpack[LockOptions]) -> None:
        keys = self._build_keys(client.min_replicas, client.key_prefix, name)
        scripts = client.scripts[RWScripts]
        #: The shared side: many owners at once while nobody else writes.
        self.read = ReadLock(client, keys, scripts, **options)
        #: The exclusive side: one owner, and no reader but that owner.
        self.write = WriteLock(client, keys, scripts, **options)
