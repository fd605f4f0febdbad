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

import logging
import weakref
from typing import TYPE_CHECKING, Any, Unpack

from django_rlock.core import lostholds
from django_rlock.core.calls import ScriptCall, hold_count_reply, ttl_reply
from django_rlock.core.exceptions import LockUpgradeError
from django_rlock.core.holder import describe
from django_rlock.core.identity import thread_owner
from django_rlock.core.lock import LockBase, LockOptions, RLock
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
    from collections.abc import Callable

    from django_rlock.core.client import LockClient

__all__ = ["ReadLock", "ReadSide", "ReadWriteLock", "WriteLock", "WriteSide", "check_rw_client"]

logger = logging.getLogger("django_rlock.lock")


def check_rw_client(min_replicas: int, name: str) -> None:
    """Refuse (ValueError) a read-write lock on a client that syncs grants to replicas."""
    if min_replicas:
        raise ValueError(
            f"read_write_lock({name!r}): a read-write lock cannot wait for replicas "
            f"(this client has min_replicas={min_replicas}); use a client "
            "built without min_replicas"
        )


class _Side(LockBase):
    """What both sides of both engines share, without I/O: the keys and the calls."""

    rw_keys: RWKeys

    def _ttl_of(self, lease: float | None) -> float:
        return self._engine.watchdog_timeout if lease is None else lease

    def _abandon_call(self, waiter_id: str) -> ScriptCall:
        return abandon_call(self.rw_keys, waiter_id, self._engine.publish_command)


class WriteSide(_Side):
    """The write side's calls and replies (sync :class:`WriteLock`, asyncio ``AsyncWriteLock``)."""

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
    """The read side's keys and calls (sync :class:`ReadLock`, asyncio ``AsyncReadLock``)."""

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


# One set of scripts per sync client, built on its first read-write lock.
_scripts: weakref.WeakKeyDictionary[LockClient, RWScripts] = weakref.WeakKeyDictionary()


def _scripts_of(client: LockClient) -> RWScripts:
    scripts = _scripts.get(client)
    if scripts is None:
        scripts = _scripts[client] = RWScripts(client.redis)
    return scripts


def _leave(scripts: RWScripts, call: ScriptCall, name: str) -> None:
    """Leave the waiting set without the lock, passing on a wake-up meant for us."""
    try:
        scripts.abandon(keys=call.keys, args=call.args)
    except Exception:
        logger.debug("could not leave the waiting set of %r", name, exc_info=True)


class WriteLock(WriteSide, RLock):
    """The write side of a :class:`ReadWriteLock`: one owner at a time, and no reader.

    Get it as ``client.read_write_lock(name).write``.
    """

    def __init__(
        self, client: LockClient, keys: RWKeys, scripts: RWScripts, **options: Unpack[LockOptions]
    ) -> None:
        super().__init__(client, keys.name, **options)
        self.rw_keys = keys
        self.keys = keys.for_write()
        self._scripts = scripts

    def __repr__(self) -> str:
        return f"<WriteLock {self.name!r}>"

    def _acquire_sender(self) -> Callable[..., Any]:
        return self._scripts.write_acquire  # type: ignore[no-any-return]

    def _release_sender(self) -> Callable[..., Any]:
        return self._scripts.write_release  # type: ignore[no-any-return]

    def _abandon(self, waiter_id: str) -> None:
        _leave(self._scripts, self._abandon_call(waiter_id), self.name)

    def force_release(self) -> bool:
        """Delete the write hold whoever has it and wake every waiter; True if it was held."""
        call = self._force_release_call()
        with self._reachable("force-release"):
            return bool(self._scripts.write_force_release(keys=call.keys, args=call.args))


class ReadLock(ReadSide, RLock):
    """The read side of a :class:`ReadWriteLock`: many owners at once, while nobody else writes.

    Get it as ``client.read_write_lock(name).read``. ``locked()`` and ``ttl()``
    are about every reader: whether any reader holds it, and when the
    longest-lived one's hold ends. A read hold's ``token`` is 0 (fencing
    tokens order writers).
    """

    def __init__(
        self, client: LockClient, keys: RWKeys, scripts: RWScripts, **options: Unpack[LockOptions]
    ) -> None:
        super().__init__(client, keys.name, **options)
        self.rw_keys = keys
        self.keys = keys.for_read()
        self._scripts = scripts

    def __repr__(self) -> str:
        return f"<ReadLock {self.name!r}>"

    def _acquire_sender(self) -> Callable[..., Any]:
        return self._scripts.read_acquire  # type: ignore[no-any-return]

    def _release_sender(self) -> Callable[..., Any]:
        return self._scripts.read_release  # type: ignore[no-any-return]

    def _abandon(self, waiter_id: str) -> None:
        _leave(self._scripts, self._abandon_call(waiter_id), self.name)

    def force_release(self) -> bool:
        """Delete every reader's hold and wake every waiter; True if any reader held it."""
        call = self._force_release_call()
        with self._reachable("force-release"):
            return int(self._scripts.read_force_release(keys=call.keys, args=call.args)) > 0

    def _readers(self) -> tuple[int, int]:
        call = readers_call(self.rw_keys)
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


class ReadWriteLock:
    """Many readers or one writer; get one from :meth:`LockClient.read_write_lock`.

    ``read`` and ``write`` are locks with the :class:`~django_rlock.core.RLock`
    API (see :mod:`django_rlock.core.rwlock`). One object may be shared by
    many threads, each its own owner.
    """

    def __init__(self, client: LockClient, name: str, **options: Unpack[LockOptions]) -> None:
        check_rw_client(client.min_replicas, name)
        keys = RWKeys.build(client.key_prefix, name)
        scripts = _scripts_of(client)
        self.keys = keys
        #: The shared side: many owners at once while nobody else writes.
        self.read = ReadLock(client, keys, scripts, **options)
        #: The exclusive side: one owner, and no reader but that owner.
        self.write = WriteLock(client, keys, scripts, **options)

    @property
    def name(self) -> str:
        """The lock's name, as the caller gave it."""
        return self.keys.name

    def __repr__(self) -> str:
        return f"<ReadWriteLock {self.name!r}>"
