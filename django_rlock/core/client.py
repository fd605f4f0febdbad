"""LockClient: one Redis connection, the holds of this process, and renewal.

A client is cheap to share and expensive to build (it owns connection pools and,
once someone waits, a pub/sub dispatcher thread): build one per server per
process and share it, as Django's ``locks`` handler does.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import redis

from django_rlock.core.connection import connect, derive_pool
from django_rlock.core.hold import Hold
from django_rlock.core.names import (
    check_key_prefix,
    check_name,
    check_watchdog_timeout,
    milliseconds,
)
from django_rlock.core.scripts import LockScripts
from django_rlock.core.waiting import ReleaseListener
from django_rlock.core.watchdog import get_watchdog

if TYPE_CHECKING:
    from django_rlock.core.lock import RLock

__all__ = ["LockClient", "LostCallback"]

logger = logging.getLogger("django_rlock.lock")

#: Called with the lock whose hold was lost. Runs on a short-lived thread of its
#: own, so a slow callback cannot delay the renewal of other locks.
LostCallback = Callable[["RLock"], object]

_clients: weakref.WeakSet[LockClient] = weakref.WeakSet()


class LockClient:
    """Entry point of the engine: makes locks that live on one Redis server.

    ``connection`` is a redis URL (``redis://``, ``rediss://``, ``unix://``) or a
    ``redis.Redis`` instance; a client built from a URL is closed by
    :meth:`close`, a passed-in instance is left to its owner. Keys are namespaced
    by ``key_prefix``. A lock taken with ``lease=None`` lives ``watchdog_timeout``
    seconds past the last renewal, renewed every third of that while held.
    """

    def __init__(
        self,
        connection: str | redis.Redis,
        *,
        key_prefix: str = "rlock",
        watchdog_timeout: float = 30.0,
    ) -> None:
        self.key_prefix = check_key_prefix(key_prefix)
        self.watchdog_timeout = check_watchdog_timeout(watchdog_timeout)
        self.redis, self._owns_redis = connect(connection)
        #: The command that announces a release ('spublish' on a sharded cluster).
        self.publish_command = "publish"
        self._scripts = LockScripts(self.redis)
        self._renewal_redis = redis.Redis(
            connection_pool=derive_pool(self.redis, **self._renewal_timeouts())
        )
        self._listener = ReleaseListener(self.redis)
        self._lock = threading.Lock()
        self._holds: dict[tuple[str, str], list[Hold]] = {}
        self._watched = False  # registered with the watchdog (on the first watchdog hold)
        self._lost_callbacks: list[LostCallback] = []
        _clients.add(self)

    def __repr__(self) -> str:
        return f"<LockClient prefix={self.key_prefix!r} watchdog_timeout={self.watchdog_timeout}>"

    def __enter__(self) -> LockClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def lock(
        self,
        name: str,
        *,
        timeout: float | None = None,
        lease: float | None = None,
        blocking: bool = True,
    ) -> RLock:
        """A reentrant lock called ``name``.

        ``timeout``, ``lease`` and ``blocking`` are the defaults used by
        ``with lock:``; :meth:`RLock.acquire` takes its own.
        """
        from django_rlock.core.lock import RLock  # noqa: PLC0415 -- lock imports client

        return RLock(self, check_name(name), timeout=timeout, lease=lease, blocking=blocking)

    def on_lost(self, callback: LostCallback) -> None:
        """Call ``callback(lock)`` whenever any hold taken through this client is lost."""
        self._lost_callbacks.append(callback)

    def close(self) -> None:
        """Stop renewing, stop listening and close the connections this client made.

        Locks still held are not released: they expire within the watchdog
        timeout (or their lease), as they would if the process died.
        """
        get_watchdog().forget(self)
        with self._lock:
            self._holds.clear()
            self._watched = False
        self._listener.close()
        self._renewal_redis.close()
        self._renewal_redis.connection_pool.disconnect()
        if self._owns_redis:
            self.redis.close()

    # -- the hold registry, used by RLock ----------------------------------------------

    def _holds_of(self, key: str, owner: str) -> list[Hold]:
        """The owner's stack of holds on ``key`` (newest last); call with ``_lock`` held."""
        return self._holds.get((key, owner), [])

    def _granted(
        self,
        lock: RLock,
        owner: str,
        *,
        token: int,
        holds: int,
        lease: float | None,
        sent_at: float,
    ) -> Hold:
        """Record a grant Redis has just made to ``owner``."""
        keys = lock.keys
        ttl = self.watchdog_timeout if lease is None else lease
        stale: Hold | None = None
        with self._lock:
            stack = self._holds.setdefault((keys.hash, owner), [])
            top = stack[-1] if stack else None
            if top is not None and not top.lost and holds > 1:
                top.count += 1
                top.deadline = max(top.deadline, sent_at + ttl)
                hold = top
                hold.watchdog = hold.watchdog or lease is None
            else:
                if top is not None and not top.lost:
                    # We believed we held it, yet Redis granted afresh: the old
                    # hold expired unnoticed (a long pause). Report it now.
                    stale = top
                hold = Hold(
                    name=keys.name,
                    key=keys.hash,
                    owner=owner,
                    token=token,
                    count=1,
                    watchdog=lease is None,
                    deadline=sent_at + ttl,
                    acquired_at=sent_at,
                )
                stack.append(hold)
                hold.add_lock(lock)
            start_watch = hold.watchdog and not self._watched
            self._watched = self._watched or hold.watchdog
        if stale is not None:
            self.declare_lost(stale, "it expired before this re-entry")
        if start_watch:
            get_watchdog().watch(self)
        return hold

    def _forget_hold(self, hold: Hold) -> None:
        """Remove a hold that is fully released; call with ``_lock`` held."""
        hold.released = True
        stack = self._holds.get((hold.key, hold.owner))
        if stack is not None and hold in stack:
            stack.remove(hold)
            if not stack:
                del self._holds[(hold.key, hold.owner)]

    def declare_lost(self, hold: Hold, reason: str, *, by_owner: bool = False) -> None:
        """Mark ``hold`` lost (once), stop renewing it, and run its callbacks.

        A renewal that races the owner's own final release is not a loss, so
        unless ``by_owner`` a hold being released is left to the release path.
        """
        with self._lock:
            if hold.lost or hold.released or (hold.releasing and not by_owner):
                return
            hold.lost = True
            locks = list(hold.locks)
        logger.warning("lock %r lost: %s", hold.name, reason)
        callbacks = [(callback, lock) for lock in locks for callback in lock.lost_callbacks]
        callbacks += [(callback, lock) for callback in self._lost_callbacks for lock in locks[:1]]
        if callbacks:
            threading.Thread(
                target=_run_callbacks, args=(callbacks,), name="rlock-on-lost", daemon=True
            ).start()

    # -- the watchdog's side (see watchdog.Renewer) ----------------------------------

    def watched_holds(self) -> list[Hold]:
        """The holds the watchdog renews now: watchdog holds not released and not lost."""
        with self._lock:
            return [
                hold
                for stack in self._holds.values()
                for hold in stack
                if hold.watchdog and not hold.lost and not hold.released
            ]

    def renew_batch(self, holds: Sequence[Hold]) -> list[bool]:
        """Extend every hold's key to the watchdog timeout in one EVAL."""
        keys = [hold.key for hold in holds]
        args: list[str | int] = [
            milliseconds(self.watchdog_timeout),
            *(hold.owner for hold in holds),
        ]
        renewed = self._scripts.renew(keys=keys, args=args, client=self._renewal_redis)
        return [bool(int(flag)) for flag in renewed]

    def _renewal_timeouts(self) -> dict[str, Any]:
        # Half an interval: a renewal that hangs ends well before the next tick,
        # and the last attempt before a deadline ends before the deadline.
        limit = self.watchdog_timeout / 6
        kwargs = self.redis.connection_pool.connection_kwargs
        socket_timeout = kwargs.get("socket_timeout") or limit
        connect_timeout = kwargs.get("socket_connect_timeout") or limit
        return {
            "socket_timeout": min(socket_timeout, limit),
            "socket_connect_timeout": min(connect_timeout, limit),
        }

    def _after_fork_in_child(self) -> None:
        # The child owns none of the parent's holds and shares none of its threads.
        self._lock = threading.Lock()
        self._holds = {}
        self._watched = False
        self._listener = ReleaseListener(self.redis)


def _run_callbacks(callbacks: list[tuple[LostCallback, RLock]]) -> None:
    for callback, lock in callbacks:
        try:
            callback(lock)
        except Exception:
            logger.exception("on_lost callback %r failed", callback)


def _reset_clients_after_fork() -> None:
    for client in list(_clients):
        client._after_fork_in_child()


os.register_at_fork(after_in_child=_reset_clients_after_fork)
