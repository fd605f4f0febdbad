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
The keys, scripts and wake-up rules are in :mod:`django_rlock.core.rwlock_scripts`.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Unpack

from django_rlock.core import lostholds
from django_rlock.core.calls import ScriptCall, hold_count_reply, ttl_reply
from django_rlock.core.exceptions import LockUpgradeError
from django_rlock.core.holder import describe
from django_rlock.core.identity import thread_owner
from django_rlock.core.lock import KindScripts, LockBase, LockOptions, RLock
from django_rlock.core.rwlock_scripts import (
    UPGRADE_REFUSED,
    RWKeys,
    RWScripts,
    abandon_call,
    read_acquire_call,
    read_force_release_call,
    read_release_call,
    readers_call,
    write_acquire_call,
    write_force_release_call,
    write_release_call,
)

if TYPE_CHECKING:
    from django_rlock.core.client import LockClient
    from django_rlock.core.names import LockKeys

__all__ = [
    "ReadLock",
    "ReadSide",
    "ReadWriteBase",
    "ReadWriteLock",
    "WriteLock",
    "WriteSide",
    "check_rw_client",
    "scripts_of",
]


def check_rw_client(min_replicas: int, name: str) -> None:
    """Refuse (ValueError) a read-write lock on a client that syncs grants to replicas."""
    if min_replicas:
        raise ValueError(
            f"read_write_lock({name!r}): a read-write lock cannot wait for replicas "
            f"(this client has min_replicas={min_replicas}); use a client "
            "built without min_replicas"
        )


class _Side(LockBase):
    """What both sides of both engines share, without I/O: the keys, scripts and calls.

    Put before the engine's lock class (``class WriteLock(WriteSide, RLock)``):
    that class's acquire, release, waiting, ``force_release`` and ``with`` then
    send this side's scripts through the sender hooks.
    """

    rw_keys: RWKeys

    def __init__(
        self, client: Any, keys: RWKeys, scripts: RWScripts, **options: Unpack[LockOptions]
    ) -> None:
        # `client` is the engine's (LockClient or AsyncLockClient): the lock
        # class after this one in the MRO takes it and finds the engine.
        super().__init__(client, keys.name, **options)
        self.rw_keys = keys
        self.keys = self._side_keys(keys)
        self._scripts = scripts
        self._side_scripts = self._pick_scripts(scripts)

    def __repr__(self) -> str:
        # The class names the side and the engine: WriteLock, AsyncReadLock...
        return f"<{type(self).__name__} {self.name!r}>"

    def _side_keys(self, keys: RWKeys) -> LockKeys:
        """The keys this side's holds are counted and waited on under."""
        raise NotImplementedError

    def _pick_scripts(self, scripts: RWScripts) -> KindScripts:
        """The side's row of scripts (see :class:`~django_rlock.core.lock.KindScripts`)."""
        raise NotImplementedError

    def _kind_scripts(self) -> KindScripts:
        return self._side_scripts

    def _abandon_call(self, waiter_id: str) -> ScriptCall:
        return abandon_call(self.rw_keys, waiter_id, self._engine.publish_command)


class WriteSide(_Side):
    """The write side's keys, calls and scripts (:class:`WriteLock`, ``AsyncWriteLock``)."""

    def _side_keys(self, keys: RWKeys) -> LockKeys:
        return keys.for_write()

    def _pick_scripts(self, scripts: RWScripts) -> KindScripts:
        return KindScripts(
            acquire=scripts.write_acquire,
            release=scripts.write_release,
            abandon=scripts.abandon,
            force_release=scripts.write_force_release,
        )

    def _acquire_call(
        self, owner: str, lease: float | None, waiter_id: str, sleep: float
    ) -> ScriptCall:
        return write_acquire_call(
            self.rw_keys,
            owner,
            ttl=self._ttl_of(lease),
            waiter_id=waiter_id,
            sleep=sleep,
            rid=self._request_id("acquire", owner),
            latch=self.keys.latch(owner),
            lost=lostholds.lost_on_server(self.keys.hash, owner),
            holder=describe(),
            read_lost=lostholds.lost_on_server(self.rw_keys.reader(owner), owner) is not None,
        )

    def _acquire_reply(
        self,
        reply: Any,
        owner: str,
        lease: float | None,
        sent_at: float,
        requested_at: float | None = None,
    ) -> float | None:
        if isinstance(reply, bytes):
            reply = reply.decode()
        if reply == UPGRADE_REFUSED:
            raise LockUpgradeError(
                f"cannot take the write lock of {self.name!r}: the caller holds its read "
                "lock, and waiting would never end (its own read hold keeps the write "
                "lock from it); release every read hold first, or take the write lock "
                "before reading (the writer may also read)",
                name=self.name,
            )
        return super()._acquire_reply(reply, owner, lease, sent_at, requested_at)

    def _release_call(self, owner: str) -> ScriptCall:
        rid = self._request_id("release", owner)
        publish = self._engine.publish_command
        return write_release_call(self.rw_keys, owner, publish, rid, self.keys.latch(owner))

    def _force_release_call(self) -> ScriptCall:
        return write_force_release_call(self.rw_keys, self._engine.publish_command)


class ReadSide(_Side):
    """The read side's keys, calls and scripts (:class:`ReadLock`, ``AsyncReadLock``)."""

    def _side_keys(self, keys: RWKeys) -> LockKeys:
        return keys.for_read()

    def _pick_scripts(self, scripts: RWScripts) -> KindScripts:
        return KindScripts(
            acquire=scripts.read_acquire,
            release=scripts.read_release,
            abandon=scripts.abandon,
            force_release=scripts.read_force_release,
        )

    def hold_keys(self, owner: str) -> tuple[str, str]:
        """The owner's own read key, and a key never written (a read has no fencing counter)."""
        return self.rw_keys.reader(owner), self.rw_keys.no_fence

    def _acquire_call(
        self, owner: str, lease: float | None, waiter_id: str, sleep: float
    ) -> ScriptCall:
        key = self.rw_keys.reader(owner)
        return read_acquire_call(
            self.rw_keys,
            owner,
            ttl=self._ttl_of(lease),
            waiter_id=waiter_id,
            sleep=sleep,
            rid=self._request_id("acquire", owner),
            latch=self.keys.latch(owner),
            lost=lostholds.lost_on_server(key, owner) is not None,
        )

    def _release_call(self, owner: str) -> ScriptCall:
        rid = self._request_id("release", owner)
        publish = self._engine.publish_command
        return read_release_call(self.rw_keys, owner, publish, rid, self.keys.latch(owner))

    def _force_release_call(self) -> ScriptCall:
        return read_force_release_call(self.rw_keys, self._engine.publish_command)

    def _readers_call(self) -> ScriptCall:
        return readers_call(self.rw_keys)


class ReadWriteBase:
    """What :class:`ReadWriteLock` and the asyncio ``AsyncReadWriteLock`` share: keys and name."""

    keys: RWKeys

    def _build_keys(self, min_replicas: int, key_prefix: str, name: str) -> RWKeys:
        """The pair's keys, once the client is known to suit a read-write lock."""
        check_rw_client(min_replicas, name)
        self.keys = RWKeys.build(key_prefix, name)
        return self.keys

    @property
    def name(self) -> str:
        """The lock's name, as the caller gave it."""
        return self.keys.name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


# One set of scripts per sync client, built on its first read-write lock.
_scripts: weakref.WeakKeyDictionary[LockClient, RWScripts] = weakref.WeakKeyDictionary()


def scripts_of(client: LockClient) -> RWScripts:
    """The read-write lock's scripts on ``client``'s connection: one set per client.

    For a class that builds the two sides itself (the Django face's alias locks).
    """
    scripts = _scripts.get(client)
    if scripts is None:
        scripts = _scripts[client] = RWScripts(client.redis)
    return scripts


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
        owner = thread_owner()
        with self._reachable("inspect"):
            return bool(self.client.redis.hexists(self.rw_keys.reader(owner), owner))

    def hold_count(self) -> int:
        """How many read holds the calling thread has (0 when none; asks Redis)."""
        owner = thread_owner()
        with self._reachable("inspect"):
            return hold_count_reply(self.client.redis.hget(self.rw_keys.reader(owner), owner))


class ReadWriteLock(ReadWriteBase):
    """Many readers or one writer; get one from :meth:`LockClient.read_write_lock`.

    ``read`` and ``write`` are locks with the :class:`~django_rlock.core.RLock`
    API (see :mod:`django_rlock.core.rwlock`). One object may be shared by
    many threads, each its own owner.
    """

    def __init__(self, client: LockClient, name: str, **options: Unpack[LockOptions]) -> None:
        keys = self._build_keys(client.min_replicas, client.key_prefix, name)
        scripts = scripts_of(client)
        #: The shared side: many owners at once while nobody else writes.
        self.read = ReadLock(client, keys, scripts, **options)
        #: The exclusive side: one owner, and no reader but that owner.
        self.write = WriteLock(client, keys, scripts, **options)
