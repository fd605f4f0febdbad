"""LockClient: one Redis deployment, wired to the hold registry, listener and watchdog.

The client owns the connections and the scripts loaded on them; what this
process holds is kept by its :class:`~django_rlock.core._protocol.holds.HoldRegistry`
(:attr:`LockClient.holds`), renewed by the process's watchdog.

A client is cheap to share and expensive to build (it owns connection pools and,
once someone waits, a pub/sub connection): build one per server per process and
share it, as Django's ``locks`` handler does.

The deployment (one server, Sentinel, Redis Cluster) is recognised once, when
the client is built, and settles which renewal connection, release listener
and publish command it uses; acquiring and releasing never ask again.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, cast

import redis
from redis.cluster import RedisCluster
from redis.exceptions import MovedError

from django_rlock.core._process import forking, leaks
from django_rlock.core._process.lockorder import check_lock_order_check, lock_order
from django_rlock.core._protocol.calls import ScriptCall
from django_rlock.core._protocol.deadlocks import check_deadlock_timeout
from django_rlock.core._protocol.holds import Hold, HoldRegistry
from django_rlock.core._protocol.layouts import (
    REDISSON,
    RLOCK,
    check_layout,
    check_sharded_subscription,
)
from django_rlock.core._protocol.lock import ACQUIRE, LockScripts, ScriptRegistry
from django_rlock.core._protocol.lockbase import LockBase
from django_rlock.core._protocol.names import (
    LockKeys,
    check_key_prefix,
    check_name,
    check_watchdog_timeout,
    milliseconds,
)
from django_rlock.core._protocol.unavailable import SLOT_MOVING, reported_unavailable
from django_rlock.core._protocol.urls import redact_url
from django_rlock.core._sync.connection import (
    RedisClient,
    any_node_client,
    connect,
    connection_settings,
    derive_client,
    derive_pool,
    describe,
    node_client_for_key,
    primaries,
    server_major_version,
)
from django_rlock.core._sync.fairlock import FairLock
from django_rlock.core._sync.leader import Leadership
from django_rlock.core._sync.locks import RLock
from django_rlock.core._sync.multilock import MultiLock, RedLock
from django_rlock.core._sync.noderounds import NodeRounds
from django_rlock.core._sync.ratelimiter import RateLimiter
from django_rlock.core._sync.redisson import RedissonRLock
from django_rlock.core._sync.rwlock import ReadWriteLock
from django_rlock.core._sync.scripts import LockScript, OomSafeScript
from django_rlock.core._sync.semaphore import Semaphore
from django_rlock.core._sync.sharding import ShardedReleaseListener, slot_of
from django_rlock.core._sync.waiting import Listener, ReleaseListener
from django_rlock.core._sync.watchdog import get_watchdog
from django_rlock.core._sync.wire import HeldClient
from django_rlock.core.defaults import (
    DEFAULT_DEADLOCK_TIMEOUT,
    DEFAULT_KEY_PREFIX,
    DEFAULT_REPLICA_SYNC_TIMEOUT,
    DEFAULT_WATCHDOG_TIMEOUT,
    renewal_socket_timeout,
)
from django_rlock.core.exceptions import LockNotReplicatedError

logger = logging.getLogger("django_rlock.lock")


#: Called with the lock whose hold was lost. Runs on a short-lived thread of its
#: own, so a slow callback cannot delay the renewal of other locks.
LostCallback = Callable[["LockBase"], object]


_clients: weakref.WeakSet[LockClient] = weakref.WeakSet()


class LockClient:
    """Entry point of the engine: makes locks that live on one Redis deployment.

    ``connection`` is a redis URL or client: one server (``redis://``,
    ``rediss://``, ``unix://``, a ``redis.Redis``), a Sentinel-managed master
    (``redis+sentinel://``, or a client from ``Sentinel.master_for``) or a Redis
    Cluster (``redis+cluster://``, a ``redis.cluster.RedisCluster``); see
    :mod:`django_rlock.core._sync.connection` for the URL forms. A client built from
    a URL is closed by :meth:`close`, a passed-in instance is left to its owner.
    Keys are namespaced by ``key_prefix``. A lock taken with ``lease=None``
    lives ``watchdog_timeout`` seconds past the last renewal, renewed every
    third of that while held.

    ``server`` is how errors name the server (for instance
    :class:`LockUnavailableError` when it cannot be reached); by default the
    URL without its credentials, or the host and port of a passed-in client.

    ``deadlock_timeout``: seconds a waiter of a plain lock waits before it
    looks for a deadlock (a cycle of waiters, across every process on this
    deployment), then between two looks; one member of a cycle found gets
    :class:`DeadlockError` (see docs/deadlocks.md). None turns detection off.

    ``lock_order_check=True`` (for tests and staging) warns with
    :class:`LockOrderWarning` the first time an owner of this process takes
    locks in an order opposite to one seen before, before any deadlock
    happens (see docs/deadlocks.md). Off, it costs nothing.

    ``min_replicas`` (Redisson's checkLockSyncedSlaves) makes every acquire
    wait, with WAIT, until that many replicas have the grant, at most
    ``replica_sync_timeout`` seconds; when fewer confirm, the grant is undone
    and :class:`LockNotReplicatedError` is raised.

    ``layout="redisson"`` shares :meth:`lock` with Java services running
    Redisson (their ``RLock`` of the same name; the name is the key, and
    ``key_prefix`` only namespaces this library's own keys beside it); the
    fair lock, read-write lock and semaphore are then refused, and so is
    ``min_replicas``. ``sharded_subscription`` (Redisson's
    ``ShardedSubscriptionMode``): ``"auto"`` announces releases with SPUBLISH
    on a Redis >= 7 cluster and PUBLISH elsewhere, ``"on"`` always with
    SPUBLISH, ``"off"`` never. See docs/redisson.md.
    """

    def __init__(
        self,
        connection: str | RedisClient,
        *,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        watchdog_timeout: float = DEFAULT_WATCHDOG_TIMEOUT,
        min_replicas: int = 0,
        replica_sync_timeout: float = DEFAULT_REPLICA_SYNC_TIMEOUT,
        server: str | None = None,
        layout: str = RLOCK,
        sharded_subscription: str = "auto",
        deadlock_timeout: float | None = DEFAULT_DEADLOCK_TIMEOUT,
        lock_order_check: bool = False,
    ) -> None:
        self.key_prefix = check_key_prefix(key_prefix)
        #: Whether the lock order check watches this client's holds.
        self.lock_order_check = check_lock_order_check(lock_order_check)
        #: Seconds a plain lock's waiter waits before it looks for a deadlock (None: never).
        self.deadlock_timeout = check_deadlock_timeout(deadlock_timeout)
        #: ``"rlock"`` or ``"redisson"``: whose keys the locks use (see :meth:`lock`).
        self.layout = check_layout(layout)
        self.sharded_subscription = check_sharded_subscription(sharded_subscription)
        if layout == REDISSON and min_replicas:
            raise ValueError(
                f"min_replicas={min_replicas!r} is not offered with layout='redisson': a grant "
                "undone for want of replicas would have to wake Redisson's waiters and give its "
                "token back; use min_replicas=0 (or layout='rlock')"
            )
        self.watchdog_timeout = check_watchdog_timeout(watchdog_timeout)
        if isinstance(min_replicas, bool) or not isinstance(min_replicas, int) or min_replicas < 0:
            raise ValueError(f"min_replicas must be an int >= 0, got {min_replicas!r}")
        if isinstance(replica_sync_timeout, bool) or not (
            isinstance(replica_sync_timeout, int | float) and 0 < replica_sync_timeout < math.inf
        ):
            raise ValueError(
                f"replica_sync_timeout must be > 0 seconds, got {replica_sync_timeout!r}"
            )
        self.min_replicas = min_replicas
        self.replica_sync_timeout = float(replica_sync_timeout)
        client, self._owns_redis = connect(connection)
        #: How errors name the server: never with its credentials.
        self.server = server or (
            redact_url(connection) if isinstance(connection, str) else describe(client)
        )
        #: The caller's client. On a cluster it is a RedisCluster, which offers
        #: every key command the locks and their callers use; it is typed as
        #: redis.Redis so that single-server code keeps type-checking.
        self.redis = cast(redis.Redis, client)
        #: The cluster behind :attr:`redis`, None on one server or Sentinel.
        self.cluster = client if isinstance(client, RedisCluster) else None
        #: The command that announces a release ('spublish' on a sharded cluster).
        self.publish_command = "publish"
        #: On a cluster, the hash slot of a key: renewals are batched per slot.
        self.slot_of: Callable[[str], int] | None = None
        if self.cluster is not None:
            self.slot_of = slot_of
            sharded = self.sharded_subscription == "on"
            if self.sharded_subscription == "auto":
                with reported_unavailable(self.server, "connect to the cluster"):
                    sharded = self._sharded_pubsub(self.cluster)
            if sharded:
                self.publish_command = "spublish"
        elif self.sharded_subscription == "on":
            self.publish_command = "spublish"  # one Redis >= 7 server takes it too
        #: Every kind's scripts on this client's connection, made on first use.
        self.scripts = ScriptRegistry(
            functools.partial(LockScript, self.redis), functools.partial(OomSafeScript, self.redis)
        )
        self._renewal_redis = derive_client(client, **self._renewal_timeouts())
        # On a cluster a renewal round is one pipeline per node (renew_batches).
        self._node_rounds = (
            NodeRounds(self._renewal_redis, renewal_socket_timeout(self.watchdog_timeout))
            if isinstance(self._renewal_redis, RedisCluster)
            else None
        )
        self.listener = self._make_listener()
        #: Runs the acquire script: plain EVALSHA, or EVAL + WAIT with min_replicas.
        self.send_acquire = (
            self.scripts[LockScripts].acquire if min_replicas == 0 else self._acquire_synced
        )
        self._bounded_clients: dict[float, redis.Redis] = {}
        self._lock = threading.Lock()  # guards the bounded and the held connections
        forking.renew_after_fork(self, "_lock")
        # Per thread, a client holding one connection of the pool (see `held`).
        # A forked child starts with none: a held socket is its parent's.
        self._held = threading.local()
        forking.renew_after_fork(self, "_held", threading.local)
        self._held_clients: weakref.WeakSet[redis.Redis] = weakref.WeakSet()
        forking.renew_after_fork(self, "_held_clients", weakref.WeakSet)
        # Threads connecting their held connection now (each counts toward the limit).
        self._held_connecting = 0
        forking.renew_after_fork(self, "_held_connecting", int)
        self._held_limit = self._held_connection_limit(min_replicas)
        #: This process's holds through this client; the watchdog renews them
        #: from the first hold it must keep alive.
        self.holds = HoldRegistry(watch=self._start_watch)
        if lock_order_check:
            lock_order.watch(self.holds)
        self._closed = False
        _clients.add(self)

    def __repr__(self) -> str:
        layout = "" if self.layout == RLOCK else f" layout={self.layout!r}"
        return (
            f"<LockClient prefix={self.key_prefix!r} watchdog_timeout={self.watchdog_timeout}"
            f"{layout}>"
        )

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
        max_hold: float | None = None,
    ) -> RLock:
        """A reentrant lock called ``name``.

        ``timeout``, ``lease`` and ``blocking`` are the defaults used by
        ``with lock:``; :meth:`RLock.acquire` takes its own. ``max_hold``
        bounds every watchdog hold taken through it (see :class:`LockOptions`).
        With ``layout="redisson"`` it is shared with Redisson's ``RLock`` of the
        same name (a :class:`~django_rlock.core._sync.redisson.RedissonRLock`).
        """
        kind = RedissonRLock if self.layout == REDISSON else RLock
        if timeout is None and lease is None and blocking is True and max_hold is None:
            return kind(self, check_name(name))  # the defaults: no keyword to pass and check
        return kind(
            self,
            check_name(name),
            timeout=timeout,
            lease=lease,
            blocking=blocking,
            max_hold=max_hold,
        )

    def multi_lock(self, *locks: RLock) -> MultiLock:
        """All-or-nothing over ``locks``, which may live on different servers.

        See :class:`~django_rlock.core._sync.multilock.MultiLock`.
        """
        return MultiLock(*locks)

    def red_lock(self, *locks: RLock) -> RedLock:
        """The Redlock algorithm over ``locks``, each on its own independent server.

        See :class:`~django_rlock.core._sync.multilock.RedLock` (and its caveats).
        """
        return RedLock(*locks)

    def fair_lock(
        self,
        name: str,
        *,
        timeout: float | None = None,
        lease: float | None = None,
        blocking: bool = True,
    ) -> FairLock:
        """A reentrant lock called ``name`` that goes to its waiters in arrival order.

        The keywords are ``with lock:``'s defaults, as for :meth:`lock`; see
        :class:`~django_rlock.core._sync.fairlock.FairLock`. A fair lock and a plain
        lock of the same name are two different locks.
        """
        return FairLock(self, check_name(name), timeout=timeout, lease=lease, blocking=blocking)

    def semaphore(
        self,
        name: str,
        permits: int,
        *,
        timeout: float | None = None,
        lease: float | None = None,
        blocking: bool = True,
        max_hold: float | None = None,
    ) -> Semaphore:
        """A semaphore called ``name`` of ``permits`` watchdog-renewed permits.

        ``timeout``, ``lease`` and ``blocking`` are the defaults used by
        ``with semaphore:``; see :class:`~django_rlock.core._sync.semaphore.Semaphore`.
        ``max_hold`` bounds each watchdog-renewed permit (see :class:`LockOptions`).
        """
        return Semaphore(
            self,
            check_name(name),
            permits,
            timeout=timeout,
            lease=lease,
            blocking=blocking,
            max_hold=max_hold,
        )

    def leader(self, name: str, *, timeout: float | None = None) -> Leadership:
        """Leader election ``name``: ``with client.leader(name) as term:`` leads, one at a time.

        The block waits until this thread is elected (at most ``timeout``
        seconds, None: as long as it takes; then LockTimeout) and runs as the
        leader; ``term.token`` fences what it writes, ``term.lost`` and
        ``term.on_lost`` tell it to step down. See :mod:`django_rlock.core._sync.leader`.
        """
        return Leadership(name, lambda: self.lock(name), timeout=timeout)

    def rate_limiter(self, name: str, rate: str, *, burst: int | None = None) -> RateLimiter:
        """A global rate limit called ``name``: ``rate`` permits per period (``"100/m"``).

        ``burst`` (default: the rate's count) is how many may be taken at once
        after idling; see :class:`~django_rlock.core._sync.ratelimiter.RateLimiter`.
        """
        return RateLimiter(self, check_name(name), rate, burst=burst)

    def on_lost(self, callback: LostCallback) -> None:
        """Call ``callback(lock)`` whenever any hold taken through this client is lost."""

        def lost(hold: Hold) -> None:
            for lock in hold.locks[:1]:
                # Every lock this client's registry records is one of its kinds.
                callback(cast(LockBase, lock))

        self.holds.on_lost(lost)

    def _start_watch(self) -> None:
        get_watchdog().watch(self)

    def close(self) -> None:
        """Stop renewing, stop listening and close the connections this client made.

        Locks still held are not released: they expire within the watchdog
        timeout (or their lease), as they would if the process died. A hold
        the watchdog kept alive can no longer be renewed, so it is declared
        lost at once (``lost``, ``on_lost``; its ``release()`` raises
        :class:`LockLostError` without a call): from now on another owner may
        get it. A fixed-lease hold needs no renewal and runs on to its lease.
        """
        self._closed = True
        get_watchdog().forget(self)
        self.holds.abandon_watched("its client was closed, so nothing renews it")
        self.listener.close()
        with self._lock:
            held_clients = list(self._held_clients)
            self._held_clients.clear()
            self._held_limit = 0  # no thread holds a connection from now on
        own = getattr(self._held, "client", None)
        for held in held_clients:
            if held is own:
                held.close()  # this thread is not inside a call on it: given back
                continue
            # Another thread's: closed, not given back, since that thread may be
            # inside a call on it, and a connection handed to the pool mid-call
            # could reach a third thread and read this call's reply. The
            # thread's client gives it back when the thread ends (or this client goes).
            connection: Any = held.connection  # Any: redis-py's Connection is untyped
            if connection is not None:
                connection.disconnect()
        for bounded in self._bounded_clients.values():
            bounded.close()
            bounded.connection_pool.disconnect()
        self._renewal_redis.close()
        if isinstance(self._renewal_redis, redis.Redis):
            self._renewal_redis.connection_pool.disconnect()
        if self._owns_redis:
            self.redis.close()

    def held(self) -> redis.Redis | None:
        """The calling thread's client for acquire and release: it holds one pool connection.

        A pool checkout and return per call costs about as much as the
        script's own Python work, so each thread using this client's locks
        keeps one connection of the caller's pool (with its retry policy),
        given back when the thread ends or the client is closed; the scripts
        run on it take the lean command path (:mod:`~django_rlock.core._sync.wire`). At most a
        quarter of the pool is held; threads beyond that, a cluster, a
        blocking pool and ``min_replicas`` (WAIT needs a pipeline) use the
        pool per call: None.
        """
        if self._held_limit == 0:
            return None  # none held (or the client is closed)
        held: redis.Redis | None = getattr(self._held, "client", None)
        if held is not None:
            return held
        with self._lock:
            if len(self._held_clients) + self._held_connecting >= self._held_limit:
                return None
            self._held_connecting += 1  # a place kept for this thread while it connects
        try:
            # Checks out and connects its connection now, in the caller's
            # `reported_unavailable`, as the call it serves would. Outside the
            # mutex: against a server that never answers, each thread waits
            # out its own socket timeout, all at once, instead of in turn. The
            # pool hands each caller a connection of its own.
            held = HeldClient(self.redis.connection_pool)
        except BaseException:
            with self._lock:
                self._held_connecting -= 1
            raise
        with self._lock:
            self._held_connecting -= 1
            closed = self._held_limit == 0
            if not closed:
                self._held_clients.add(held)
        if closed:
            held.close()  # the client was closed meanwhile: given back, never kept
            return None
        self._held.client = held
        return held

    def _held_connection_limit(self, min_replicas: int) -> int:
        pool = self.redis.connection_pool if self.cluster is None else None
        if min_replicas or pool is None or isinstance(pool, redis.BlockingConnectionPool):
            return 0
        return max(int(getattr(pool, "max_connections", 0) or 0) // 4, 0)

    def bounded(self, timeout: float) -> redis.Redis | None:
        """A connection to this client's server whose calls end within ``timeout`` seconds.

        No retries. RedLock sends its attempts through it, so a slow server
        cannot eat the lock's validity. None on a cluster (its own client is used).
        """
        if self.cluster is not None:
            return None
        with self._lock:
            bounded = self._bounded_clients.get(timeout)
            if bounded is None:
                pool = derive_pool(
                    self.redis, socket_timeout=timeout, socket_connect_timeout=timeout
                )
                bounded = self._bounded_clients[timeout] = redis.Redis(connection_pool=pool)
            return bounded

    # -- topology, settled once at construction --------------------------------------

    @staticmethod
    def _sharded_pubsub(cluster: RedisCluster) -> bool:
        # Every primary must know SSUBSCRIBE (a cluster mid-upgrade may not).
        return all(
            server_major_version(cluster.get_redis_connection(node)) >= 7
            for node in primaries(cluster)
        )

    def _make_listener(self) -> Listener:
        cluster = self.cluster
        if cluster is None:
            return ReleaseListener(self.redis, sharded=self.publish_command == "spublish")
        if self.publish_command == "spublish":
            return ShardedReleaseListener(cluster)
        # Before Redis 7 a PUBLISH reaches every node: any one node will do. Its
        # count is of the publishing node's subscribers alone, so these waiters
        # are never handed a lock (channels.py).
        return ReleaseListener(any_node_client(cluster), hand_over=False)

    # -- replica-synced acquisition (min_replicas) -----------------------------------

    def _acquire_synced(
        self, keys: list[str], args: list[str | int], client: RedisClient | None = None
    ) -> Any:
        """The acquire script, then WAIT on the same connection; undo a grant too few confirm.

        WAIT counts the replicas that have every write the *connection* made,
        hence one pipeline (one connection, one round trip). On a cluster it
        runs on the node owning the lock's slot.
        """
        target = client if isinstance(client, redis.Redis) else self._node_client(keys[0])
        try:
            reply, acknowledged = self._eval_and_wait(target, keys, args)
        except MovedError:
            # The slot moved since the cluster map was read: refresh it, try once more.
            assert self.cluster is not None
            self.cluster.nodes_manager.initialize()
            reply, acknowledged = self._eval_and_wait(self._node_client(keys[0]), keys, args)
        if isinstance(reply, list) and int(acknowledged) < self.min_replicas:
            self._undo_grant(keys[0], owner=str(args[0]))
            name = LockKeys.name_of(self.key_prefix, keys[0]) or keys[0]
            raise LockNotReplicatedError(
                f"lock {name!r} was granted by {describe(self.redis)} but only "
                f"{int(acknowledged)} of the {self.min_replicas} required replicas confirmed it "
                f"within {self.replica_sync_timeout}s; the grant was undone",
                name=name,
                required=self.min_replicas,
                acknowledged=int(acknowledged),
            )
        return reply

    def _node_client(self, key: str) -> redis.Redis:
        if self.cluster is None:
            return self.redis
        return node_client_for_key(self.cluster, key)

    def _eval_and_wait(
        self, target: redis.Redis, keys: list[str], args: list[str | int]
    ) -> tuple[Any, int]:
        pipe = target.pipeline(transaction=False)
        pipe.eval(ACQUIRE, len(keys), *keys, *args)
        pipe.wait(self.min_replicas, milliseconds(self.replica_sync_timeout))
        reply, acknowledged = pipe.execute()
        return reply, int(acknowledged)

    def _undo_grant(self, hash_key: str, owner: str) -> None:
        # One release of the hold just granted (a re-entry gives back its one
        # extra hold); a full release wakes the next waiter as usual.
        keys = LockKeys.build(self.key_prefix, LockKeys.name_of(self.key_prefix, hash_key) or "")
        try:
            self.scripts[LockScripts].release(
                keys=[hash_key, keys.channel, keys.waiters], args=[owner, self.publish_command]
            )
        except (redis.RedisError, *SLOT_MOVING):  # SlotNotCoveredError is no RedisError
            logger.warning(
                "could not undo an unreplicated grant of %r; it expires with its lease",
                keys.name,
                exc_info=True,
            )

    # -- the watchdog's side (see watchdog.Renewer), on the hold registry -------------

    def declare_lost(self, hold: Hold, reason: str, *, by_owner: bool = False) -> None:
        """Mark ``hold`` lost (once), stop renewing it, and run its callbacks.

        See :meth:`HoldRegistry.declare_lost
        <django_rlock.core._protocol.holds.HoldRegistry.declare_lost>`.
        """
        self.holds.declare_lost(hold, reason, by_owner=by_owner)

    def watched_holds(self) -> list[Hold]:
        """The holds the watchdog renews now: watchdog holds not released, lost or leaked."""
        return self.holds.watched_holds()

    def owner_gone(self, hold: Hold) -> None:
        """``hold``'s owner ended holding it (see :mod:`~django_rlock.core._process.leaks`).

        A thread's hold is reported and given back here; a task's, by the
        task's own end on its event loop (its lock's asyncio client lives
        there), so the watchdog only stops renewing it.
        """
        if not isinstance(hold.locks[0] if hold.locks else None, RLock):
            return
        leaks.thread_gone(self.holds, hold)

    def renewed(self, hold: Hold, sent_at: float, pttl_ms: int) -> None:
        """A renewal sent at ``sent_at`` left ``hold``'s key ``pttl_ms`` to live."""
        self.holds.extend(hold, sent_at, pttl_ms)

    def renew_batch(self, holds: Sequence[Hold]) -> list[int]:
        """Extend every hold's key to at least the watchdog timeout in one EVAL.

        Returns, per hold, the key's PTTL in ms after the call (0: no longer
        held). A key is never shortened: a lease longer than the timeout runs
        on. On a cluster the watchdog passes holds of one slot only (see
        :attr:`slot_of`), and sends a round through :meth:`renew_batches`.
        """
        call = self._renew_call(holds)
        left = self.scripts[LockScripts].renew(
            keys=call.keys, args=call.args, client=self._renewal_redis
        )
        return [int(pttl_ms) for pttl_ms in left]

    def renew_batches(self, batches: Sequence[Sequence[Hold]]) -> list[list[int] | Exception]:
        """On a cluster: renew every batch (each of one slot) with one pipeline per node, at once.

        Per batch what :meth:`renew_batch` returns, or the error that batch
        alone met (a node's MOVED reply, its connection failing, no reply
        within the renewal socket timeout); see
        :mod:`~django_rlock.core._sync.noderounds`. One server or Sentinel has
        no nodes to group by: the watchdog sends :meth:`renew_batch` per batch.
        """
        if self._node_rounds is None:
            raise RuntimeError("renew_batches serves a cluster client only; use renew_batch")
        script = self.scripts[LockScripts].renew
        replies = self._node_rounds.run(script, [self._renew_call(batch) for batch in batches])
        return [
            reply if isinstance(reply, Exception) else [int(pttl_ms) for pttl_ms in reply]
            for reply in replies
        ]

    def refresh_slot_map(self) -> None:
        """After :meth:`renew_batches`: read the slot map anew if a batch met a sign it moved.

        A MOVED reply, a node unreachable or silent, a CLUSTERDOWN (see
        :meth:`NodeRounds.refresh_map <django_rlock.core._sync.noderounds.NodeRounds.refresh_map>`);
        else, or off a cluster, nothing.
        """
        if self._node_rounds is not None:
            self._node_rounds.refresh_map()

    def _renew_call(self, holds: Sequence[Hold]) -> ScriptCall:
        keys = [key for hold in holds for key in (hold.key, hold.fence)]
        args: list[str | int] = [
            milliseconds(self.watchdog_timeout),
            0,
            *(hold.owner for hold in holds),
        ]
        return ScriptCall(keys, args)

    def _renewal_timeouts(self) -> dict[str, Any]:
        # A renewal that hangs ends well before the next tick, and the last
        # attempt before a deadline ends before the deadline (see core.defaults).
        limit = renewal_socket_timeout(self.watchdog_timeout)
        kwargs = connection_settings(self.redis)
        socket_timeout = kwargs.get("socket_timeout") or limit
        connect_timeout = kwargs.get("socket_connect_timeout") or limit
        return {
            "socket_timeout": min(socket_timeout, limit),
            "socket_connect_timeout": min(connect_timeout, limit),
        }

    def _after_fork_in_child(self) -> None:
        # The child shares none of the parent's threads (its holds: see core.hold).
        self._lock = threading.Lock()
        if self._closed:
            # Nothing listens through a closed client, and a closed cluster
            # client has no node left to make a listener on (before Redis 7).
            return
        self.listener = self._make_listener()

    def read_write_lock(
        self,
        name: str,
        *,
        timeout: float | None = None,
        lease: float | None = None,
        blocking: bool = True,
    ) -> ReadWriteLock:
        """Many readers or one writer, called ``name``: ``.read`` and ``.write``.

        See :class:`~django_rlock.core._sync.rwlock.ReadWriteLock`. ``timeout``,
        ``lease`` and ``blocking`` are both sides' defaults for ``with``.
        Refused (ValueError) on a client with ``min_replicas``.
        """
        return ReadWriteLock(
            self, check_name(name), timeout=timeout, lease=lease, blocking=blocking
        )


@forking.after_fork_in_child
def _reset_clients_after_fork() -> None:
    # Every client is reset, whatever another's reset raised: one left with the
    # parent's mutexes (held by a thread the child does not have) hangs the
    # child at its first wait. The first error is raised last (as forking does).
    error: Exception | None = None
    for client in list(_clients):
        try:
            client._after_fork_in_child()
        except Exception as failure:  # noqa: BLE001 -- raised below, after the other clients
            error = error or failure
    if error is not None:
        raise error
