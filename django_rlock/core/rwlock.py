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
from django_rlock.core.lock import LockOptions, RLock
from django_rlock.core.rwlock_scripts import (
    READ_ACQUIRE,
    READ_FORCE_RELEASE,
    READ_RELEASE,
    READERS,
    RW_ABANDON,
    UPGRADE_REFUSED,
    WRITE_ACQUIRE,
    WRITE_FORCE_RELEASE,
    WRITE_RELEASE,
    RWKeys,
    read_acquire_call,
    read_release_call,
    write_acquire_call,
    write_release_call,
)
from django_rlock.core.scripts import LockScript, OomSafeScript

if TYPE_CHECKING:
    from collections.abc import Callable

    from django_rlock.core.client import LockClient

__all__ = ["ReadLock", "ReadWriteLock", "WriteLock"]

logger = logging.getLogger("django_rlock.lock")


class _RWScripts:
    """The read-write lock's scripts, registered against one client's Redis connection."""

    def __init__(self, redis: Any) -> None:
        # Acquires stay plain (under OOM they fail whole); giving back runs under OOM.
        self.read_acquire = LockScript(redis, READ_ACQUIRE)
        self.write_acquire = LockScript(redis, WRITE_ACQUIRE)
        self.read_release = OomSafeScript(redis, READ_RELEASE)
        self.write_release = OomSafeScript(redis, WRITE_RELEASE)
        self.abandon = OomSafeScript(redis, RW_ABANDON)
        self.read_force_release = OomSafeScript(redis, READ_FORCE_RELEASE)
        self.write_force_release = OomSafeScript(redis, WRITE_FORCE_RELEASE)
        self.readers = LockScript(redis, READERS)


# One set of scripts per client, built on its first read-write lock.
_scripts: weakref.WeakKeyDictionary[LockClient, _RWScripts] = weakref.WeakKeyDictionary()


def _scripts_of(client: LockClient) -> _RWScripts:
    scripts = _scripts.get(client)
    if scripts is None:
        scripts = _scripts[client] = _RWScripts(client.redis)
    return scripts


class _Side(RLock):
    """What the read and the write side share: the keys, the scripts, the waiting set."""

    def __init__(
        self, client: LockClient, keys: RWKeys, scripts: _RWScripts, **options: Unpack[LockOptions]
    ) -> None:
        super().__init__(client, keys.name, **options)
        self.rw_keys = keys
        self._scripts = scripts

    def _ttl_of(self, lease: float | None) -> float:
        return self._engine.watchdog_timeout if lease is None else lease

    def _abandon(self, waiter_id: str) -> None:
        """Leave the waiting set without the lock, passing on a wake-up meant for us."""
        keys = self.rw_keys
        try:
            self._scripts.abandon(
                keys=[keys.write, keys.channel, keys.waiters],
                args=[waiter_id, self.client.publish_command],
            )
        except Exception:
            logger.debug("could not leave the waiting set of %r", self.name, exc_info=True)


class WriteLock(_Side):
    """The write side of a :class:`ReadWriteLock`: one owner at a time, and no reader.

    Get it as ``client.read_write_lock(name).write``.
    """

    def __init__(
        self, client: LockClient, keys: RWKeys, scripts: _RWScripts, **options: Unpack[LockOptions]
    ) -> None:
        super().__init__(client, keys, scripts, **options)
        self.keys = keys.for_write()

    def __repr__(self) -> str:
        return f"<WriteLock {self.name!r}>"

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
        )

    def _acquire_sender(self) -> Callable[..., Any]:
        return self._scripts.write_acquire

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
                f"cannot take the write lock of {self.name!r}: the calling thread holds its "
                "read lock, and waiting would never end (its own read hold keeps the write "
                "lock from it); release every read hold first, or take the write lock "
                "before reading (the writer may also read)",
                name=self.name,
            )
        return super()._acquire_reply(reply, owner, lease, sent_at, requested_at)

    def _release_call(self, owner: str) -> ScriptCall:
        rid = self._request_id("release", owner)
        publish = self.client.publish_command
        return write_release_call(self.rw_keys, owner, publish, rid, self.keys.latch(owner))

    def _release_sender(self) -> Callable[..., Any]:
        return self._scripts.write_release

    def force_release(self) -> bool:
        """Delete the write hold whoever has it and wake every waiter; True if it was held."""
        keys = self.rw_keys
        with self._reachable("force-release"):
            return bool(
                self._scripts.write_force_release(
                    keys=[keys.write, keys.channel], args=[self.client.publish_command]
                )
            )


class ReadLock(_Side):
    """The read side of a :class:`ReadWriteLock`: many owners at once, while nobody else writes.

    Get it as ``client.read_write_lock(name).read``. ``locked()`` and ``ttl()``
    are about every reader: whether any reader holds it, and when the
    longest-lived one's hold ends. A read hold's ``token`` is 0 (fencing
    tokens order writers).
    """

    def __init__(
        self, client: LockClient, keys: RWKeys, scripts: _RWScripts, **options: Unpack[LockOptions]
    ) -> None:
        super().__init__(client, keys, scripts, **options)
        self.keys = keys.for_read()

    def __repr__(self) -> str:
        return f"<ReadLock {self.name!r}>"

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

    def _acquire_sender(self) -> Callable[..., Any]:
        return self._scripts.read_acquire

    def _release_call(self, owner: str) -> ScriptCall:
        rid = self._request_id("release", owner)
        publish = self.client.publish_command
        return read_release_call(self.rw_keys, owner, publish, rid, self.keys.latch(owner))

    def _release_sender(self) -> Callable[..., Any]:
        return self._scripts.read_release

    def force_release(self) -> bool:
        """Delete every reader's hold and wake every waiter; True if any reader held it."""
        keys = self.rw_keys
        with self._reachable("force-release"):
            deleted = self._scripts.read_force_release(
                keys=[keys.readers, keys.channel],
                args=[self.client.publish_command, keys.reader_prefix],
            )
        return int(deleted) > 0

    def _readers(self) -> tuple[int, int]:
        keys = self.rw_keys
        with self._reachable("inspect"):
            live, longest = self._scripts.readers(keys=[keys.readers], args=[keys.reader_prefix])
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
        if client.min_replicas:
            raise ValueError(
                f"read_write_lock({name!r}): a read-write lock cannot wait for replicas "
                f"(this client has min_replicas={client.min_replicas}); use a client "
                "built without min_replicas"
            )
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
