"""Locks in this process's memory: for tests and single-process development.

::

    RLOCKS = {"default": {"BACKEND": "django_rlock.backends.locmem.LocMemLockBackend"}}

The semantics are the Redis backend's: reentrant per thread, fencing tokens,
leases that expire, ``force_release``, lost holds, signals. What it cannot do
is lock across processes: two gunicorn workers each have their own locks, so
the system check ``django_rlock.W001`` warns when it is used with DEBUG off.

Aliases with the same ``LOCATION`` (default ``""``) share one store, as
Django's locmem caches do. A watchdog hold never expires here: the process
that would have renewed it is the one holding the memory; its ``ttl()``
reports the watchdog timeout, as a just-renewed Redis lock would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from django_rlock.backends.base import BaseLockBackend, LockInfo, display_owner
from django_rlock.core import clock, forking
from django_rlock.core.exceptions import LockLostError, LockNotOwnedError, LockTimeout
from django_rlock.core.identity import thread_owner
from django_rlock.core.lock import RLock, check_blocking
from django_rlock.core.names import LockKeys, check_lease, check_name, check_timeout
from django_rlock.exceptions import LockSettingError
from django_rlock.reporting import ReportingLock, send_lost

__all__ = ["LocMemLock", "LocMemLockBackend"]


@dataclass(eq=False)
class _Entry:
    """A held lock: the owners' hold counts and when it expires (None: never)."""

    owners: dict[str, int]
    expires_at: float | None


@dataclass(eq=False)
class _Hold:
    """One owner's hold as the owner knows it (the twin of the core's Hold)."""

    token: int
    count: int
    locks: list[_LocMemRLock] = field(default_factory=list)
    lost: bool = False


class _Store:
    """The locks of one LOCATION, guarded by one condition variable."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        forking.renew_after_fork(self, "cond", threading.Condition)
        self.entries: dict[str, _Entry] = {}
        self.fences: dict[str, int] = {}
        self.holds: dict[tuple[str, str], _Hold] = {}

    def expire(self, key: str, now: float) -> list[_Hold]:
        """Drop ``key`` if its time is up; the holds lost by it. Call with ``cond`` held."""
        entry = self.entries.get(key)
        if entry is None or entry.expires_at is None or now < entry.expires_at:
            return []
        del self.entries[key]
        self.cond.notify_all()
        return self.mark_lost(key, entry)

    def mark_lost(self, key: str, entry: _Entry) -> list[_Hold]:
        """Mark the holds of ``entry``'s owners lost; the newly lost ones."""
        lost = []
        for owner in entry.owners:
            hold = self.holds.get((key, owner))
            if hold is not None and not hold.lost:
                hold.lost = True
                lost.append(hold)
        return lost


_stores: dict[str, _Store] = {}
_stores_lock = threading.Lock()


@forking.after_fork_in_child
def _reset_after_fork() -> None:
    global _stores_lock  # noqa: PLW0603 -- a mutex held across fork stays held in the child
    _stores_lock = threading.Lock()


def _store(location: str) -> _Store:
    with _stores_lock:
        return _stores.setdefault(location, _Store())


def _announce_lost(holds: list[_Hold]) -> None:
    """Run the loss callbacks of ``holds`` on a short-lived thread, as the core does."""
    calls: list[tuple[Callable[[RLock], object], RLock]] = []
    for hold in holds:
        for lock in hold.locks:
            calls += [(callback, lock) for callback in lock.lost_callbacks]
        if hold.locks:
            calls.append((send_lost, hold.locks[0]))
    if calls:
        threading.Thread(target=_run, args=(calls,), name="rlock-on-lost", daemon=True).start()


def _run(calls: list[tuple[Callable[[RLock], object], RLock]]) -> None:
    for callback, lock in calls:
        try:
            callback(lock)
        except Exception:
            import logging  # noqa: PLC0415 -- only on this rare path

            logging.getLogger("django_rlock.lock").exception("on_lost callback %r failed", callback)


class _LocMemRLock(RLock):
    """:class:`RLock`'s behaviour on an in-memory store instead of Redis."""

    def __init__(
        self,
        backend: LocMemLockBackend,
        name: str,
        *,
        timeout: float | None = None,
        lease: float | None = None,
        blocking: bool = True,
    ) -> None:
        # RLock.__init__ wants a LockClient; this lock talks to a store instead.
        self.keys = LockKeys.build(backend.key_prefix, name)
        self.timeout = check_timeout(timeout)
        self.lease = check_lease(lease)
        self.blocking = check_blocking(blocking, self.timeout)
        self.lost_callbacks = []
        self._local = threading.local()
        self._store = backend.store
        self._watchdog_timeout = backend.watchdog_timeout

    def __repr__(self) -> str:
        return f"<LocMemLock {self.name!r}>"

    def acquire(
        self, blocking: bool = True, timeout: float | None = None, lease: float | None = None
    ) -> bool:
        """Take the lock (or one more hold on it); see :meth:`RLock.acquire`."""
        wait = check_timeout(timeout)
        lease_seconds = check_lease(lease)
        check_blocking(blocking, wait)
        owner, key, store = thread_owner(), self.keys.hash, self._store
        deadline = None if wait is None else clock.monotonic() + wait
        lost: list[_Hold] = []
        with store.cond:
            while True:
                now = clock.monotonic()
                lost += store.expire(key, now)
                entry = store.entries.get(key)
                if entry is None or owner in (entry.owners if entry else {}):
                    self._grant(entry, owner, now, lease_seconds)
                    acquired = True
                    break
                if not blocking or (deadline is not None and now >= deadline):
                    acquired = False
                    break
                limits = [] if deadline is None else [deadline - now]
                if entry.expires_at is not None:
                    limits.append(entry.expires_at - now)
                store.cond.wait(max(min(limits), 0.001) if limits else None)
        _announce_lost(lost)
        return acquired

    def _grant(self, entry: _Entry | None, owner: str, now: float, lease: float | None) -> None:
        # Called with the store's condition held.
        store, key = self._store, self.keys.hash
        expires_at = None if lease is None else now + lease
        if entry is None:
            store.entries[key] = _Entry(owners={owner: 1}, expires_at=expires_at)
            # Tokens look like the Redis backend's: at least the clock in microseconds.
            token = store.fences[key] = max(store.fences.get(key, 0) + 1, time.time_ns() // 1000)
            hold = store.holds[(key, owner)] = _Hold(token=token, count=1)
        else:
            entry.owners[owner] += 1
            if entry.expires_at is not None:
                # A re-entry never shortens the lock's life (as in the Lua script).
                entry.expires_at = None if expires_at is None else max(entry.expires_at, expires_at)
            hold = store.holds[(key, owner)]
            hold.count += 1
        if all(existing is not self for existing in hold.locks):
            hold.locks.append(self)
        self._local.lost = False

    def __enter__(self) -> RLock:
        if not self.acquire(self.blocking, self.timeout, self.lease):
            remaining = self.ttl()
            raise LockTimeout(
                f"could not acquire lock {self.name!r} within {self.timeout}s",
                name=self.name,
                retry_after=remaining,
            )
        return self

    def release(self) -> None:
        """Give back one hold; see :meth:`RLock.release`."""
        owner, key, store = thread_owner(), self.keys.hash, self._store
        with store.cond:
            lost = store.expire(key, clock.monotonic())
            hold = store.holds.get((key, owner))
            entry = store.entries.get(key)
            if entry is not None and owner in entry.owners:
                entry.owners[owner] -= 1
                if hold is not None:
                    hold.count -= 1
                if entry.owners[owner] == 0:
                    del entry.owners[owner]
                    store.holds.pop((key, owner), None)
                    if not entry.owners:
                        del store.entries[key]
                        store.cond.notify_all()
                error: Exception | None = None
            elif hold is None:
                error = LockNotOwnedError(
                    f"cannot release lock {self.name!r}: the calling thread does not hold it",
                    name=self.name,
                )
            else:
                if not hold.lost:
                    hold.lost = True
                    lost.append(hold)
                hold.count -= 1
                if hold.count <= 0:
                    del store.holds[(key, owner)]
                    self._local.lost = True
                error = LockLostError(
                    f"lock {self.name!r} was lost: it expired or another owner took it "
                    "before release",
                    name=self.name,
                )
        _announce_lost(lost)
        if error is not None:
            raise error

    def force_release(self) -> bool:
        """Delete the lock whoever holds it and wake its waiters; True if it was held."""
        key, store = self.keys.hash, self._store
        with store.cond:
            lost = store.expire(key, clock.monotonic())
            entry = store.entries.pop(key, None)
            if entry is not None:
                lost += store.mark_lost(key, entry)
                store.cond.notify_all()
        _announce_lost(lost)
        return entry is not None

    def _entry(self) -> _Entry | None:
        """The live entry of this lock (expiring it when due)."""
        store = self._store
        with store.cond:
            lost = store.expire(self.keys.hash, clock.monotonic())
            entry = store.entries.get(self.keys.hash)
        _announce_lost(lost)
        return entry

    def locked(self) -> bool:
        """True when anyone holds the lock."""
        return self._entry() is not None

    def owned(self) -> bool:
        """True when the calling thread holds the lock."""
        return self.hold_count() > 0

    def hold_count(self) -> int:
        """How many holds the calling thread has on the lock."""
        entry = self._entry()
        return 0 if entry is None else entry.owners.get(thread_owner(), 0)

    def ttl(self) -> float | None:
        """Seconds until the lock expires; None when unheld (a watchdog hold: the timeout)."""
        entry = self._entry()
        if entry is None:
            return None
        if entry.expires_at is None:
            return self._watchdog_timeout
        return max(entry.expires_at - clock.monotonic(), 0.0)

    @property
    def token(self) -> int | None:
        """The fencing token of the calling thread's hold, None when it holds none."""
        self._entry()
        hold = self._store.holds.get((self.keys.hash, thread_owner()))
        return None if hold is None else hold.token

    @property
    def lost(self) -> bool:
        """True when a hold the calling thread took through this lock was lost."""
        self._entry()
        hold = self._store.holds.get((self.keys.hash, thread_owner()))
        if hold is not None:
            return hold.lost
        return bool(getattr(self._local, "lost", False))


class LocMemLock(ReportingLock, _LocMemRLock):
    """An in-memory lock that sends the lock signals and writes the slow-lock log."""


class LocMemLockBackend(BaseLockBackend):
    """Locks in process memory; ``LOCATION`` names the store (aliases may share one)."""

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        location = params.get("LOCATION", "")
        if not isinstance(location, str):
            raise LockSettingError(
                f"RLOCKS[{alias!r}]['LOCATION'] of a LocMem backend must be a str (a store "
                f"name), not {type(location).__name__}",
                check_id="django_rlock.E003",
            )
        self._check_options({}, "the LocMem backend, which takes none")
        self.location = location
        self.store = _store(location)

    def lock(
        self,
        name: str,
        *,
        timeout: float | None = None,
        lease: float | None = None,
        blocking: bool = True,
    ) -> LocMemLock:
        """An in-memory reentrant lock called ``name`` (see :meth:`BaseLockBackend.lock`)."""
        lock = LocMemLock(self, check_name(name), timeout=timeout, lease=lease, blocking=blocking)
        lock.backend = self
        return lock

    def _live_entries(self) -> Iterator[tuple[str, _Entry, int | None]]:
        store = self.store
        with store.cond:
            now = clock.monotonic()
            lost = [hold for key in list(store.entries) for hold in store.expire(key, now)]
            live = [(key, entry, store.fences.get(key)) for key, entry in store.entries.items()]
        _announce_lost(lost)
        yield from live

    def names(self, pattern: str = "*") -> Iterator[str]:
        """Held lock names matching the glob ``pattern``."""
        for key, _, _ in self._live_entries():
            name = LockKeys.name_of(self.key_prefix, key)
            if name is not None and fnmatchcase(name, pattern):
                yield name

    def inspect(self, name: str) -> LockInfo | None:
        """Holders, TTL and last fencing token of lock ``name``."""
        lock = self.lock(name)
        store = self.store
        with store.cond:
            entry = store.entries.get(lock.keys.hash)
            owners = dict(entry.owners) if entry else {}
            token = store.fences.get(lock.keys.hash)
        ttl = lock.ttl()
        if not owners or ttl is None:
            return None
        holders = {display_owner(owner): count for owner, count in owners.items()}
        return LockInfo(name=name, holders=holders, ttl=ttl, token=token)
