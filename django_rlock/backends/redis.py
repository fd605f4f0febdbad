"""Locks on a Redis server: the default backend.

::

    RLOCKS = {
        "default": {
            "BACKEND": "django_rlock.backends.redis.RedisLockBackend",
            "LOCATION": "redis://127.0.0.1:6379/0",  # rediss://, unix:///path.sock?db=0
            "KEY_PREFIX": "shop",
            "OPTIONS": {"socket_timeout": 5},       # passed to redis.Redis.from_url
        },
        # Or reuse a Django Redis cache's servers and connection pool:
        "cached": {"CACHE": "default"},
    }

``LOCATION`` takes a user and password (``redis://user:secret@host:6379/0``)
for AUTH and ACLs; ``OPTIONS`` takes any ``redis.Redis`` keyword (``username``,
``password``, ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``,
``ssl_cert_reqs``, ``socket_connect_timeout``...). The client is built on
first use and shared by every thread of the process.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from typing import Any, Unpack

import redis
import redis.asyncio

from django_rlock import _conf as conf
from django_rlock._keys import warn_unformatted_from_user
from django_rlock._observers.eviction import maxmemory_policy as read_maxmemory_policy
from django_rlock._observers.eviction import report_eviction_policy
from django_rlock.backends._family import (
    AliasFairLock,
    AliasReadWriteLock,
    AsyncAliasFairLock,
    AsyncAliasReadWriteLock,
)
from django_rlock.backends._locks import (
    AliasLock,
    AsyncAliasLock,
    AsyncRedissonAliasLock,
    RedissonAliasLock,
)
from django_rlock.backends._loopclients import LoopClients
from django_rlock.backends._ratelimiters import (
    AliasRateLimiter,
    AsyncAliasRateLimiter,
    AsyncLimiter,
)
from django_rlock.backends._semaphores import AliasSemaphore, AsyncAliasSemaphore
from django_rlock.backends.base import (
    AsyncLock,
    AsyncReadWriteLock,
    BaseLockBackend,
    LockInfo,
    display_owner,
)
from django_rlock.cache import check_lock_cache, lock_client_for
from django_rlock.core import LockClient
from django_rlock.core._faces import (
    CLUSTER_SCHEMES,
    DESCRIPTION_FIELDS,
    REDISSON,
    SENTINEL_SCHEMES,
    TOKEN_FIELD,
    LimiterState,
    LockKeys,
    LockOptions,
    RedisClient,
    check_name,
    check_redisson_name,
    check_url,
    connection_options,
    derive_client,
    escape,
    from_url,
    is_holder_field,
    read_hold,
    read_holder,
    read_limiter_state,
    redact_url,
    redisson_keys,
    reported_unavailable,
)
from django_rlock.core.aio import AsyncLockClient
from django_rlock.exceptions import LockSettingError

__all__ = ["RedisLockBackend"]

_SCHEMES = (
    "redis://",
    "rediss://",
    "unix://",
    *(f"{scheme}://" for scheme in SENTINEL_SCHEMES + CLUSTER_SCHEMES),
)
_ASYNC_SCHEMES = ("redis://", "rediss://", "unix://")
_SCAN_BATCH = 1000
_PROBE_SECONDS = 5.0


def _token(field: str | None, counter: bytes | None) -> int | None:
    """A lock's last fencing token: its hash's token field, else its fencing counter.

    (A lock that a client of an older version granted has only the counter.)
    """
    if field is not None:
        return int(field)
    return None if counter is None else int(counter)


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


def _glob_escape(text: str) -> str:
    """``text`` as a literal inside a Redis MATCH pattern."""
    return "".join(f"\\{char}" if char in "*?[]\\" else char for char in text)


class RedisLockBackend(BaseLockBackend):
    """Locks on one Redis server, given by ``LOCATION`` or by a cache alias (``CACHE``)."""

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.cache_alias: str | None = params.get("CACHE")
        self.location = self._check_location(params)
        self.min_replicas = conf.min_replicas(alias)
        self.replica_sync_timeout = conf.replica_sync_timeout(alias)
        #: ``"rlock"``, or ``"redisson"``: locks shared with Redisson (docs/redisson.md).
        self.layout = conf.layout(alias)
        self.sharded_subscription = conf.sharded_subscription(alias)
        self._check_layout()
        if self.cache_alias is not None:
            self._check_options({}, "an alias using CACHE (the cache's own OPTIONS apply)")
        else:
            self._check_options(*self._accepted_options())
        self._client: LockClient | None = None
        self._redis: RedisClient | None = None  # the client we built, and so close
        # asyncio clients are bound to their event loop: one per loop, closed with it.
        self._async_clients = LoopClients()

    def _check_location(self, params: dict[str, Any]) -> str:
        where = f"RLOCKS[{self.alias!r}]"
        if self.cache_alias is not None:
            if "LOCATION" in params:
                raise LockSettingError(
                    f"{where} sets both LOCATION and CACHE; keep one", check_id="django_rlock.E003"
                )
            check_lock_cache(self.cache_alias, where)
            return ""
        location = params.get("LOCATION", conf.DEFAULT_LOCATION)
        if not isinstance(location, str) or not location.startswith(_SCHEMES):
            raise LockSettingError(
                f"{where}['LOCATION'] must be a redis URL (redis://, rediss://, unix://, "
                "redis+sentinel:// or redis+cluster://), "
                f"got {location!r}",
                check_id="django_rlock.E003",
            )
        try:
            check_url(location)
        except ValueError as error:
            raise LockSettingError(
                f"{where}['LOCATION'] is not a valid redis URL: {error}",
                check_id="django_rlock.E003",
            ) from None
        return location

    def _check_layout(self) -> None:
        if self.layout != REDISSON:
            return
        where = f"RLOCKS[{self.alias!r}] has LAYOUT 'redisson'"
        if self.cache_alias is not None:
            raise LockSettingError(
                f"{where} and CACHE: a cache's lock client keeps this library's layout; "
                "give the alias its own LOCATION",
                check_id="django_rlock.E010",
            )
        if self.min_replicas:
            raise LockSettingError(
                f"{where} and MIN_REPLICAS {self.min_replicas}: replica-synced grants are "
                "not offered in that layout; set MIN_REPLICAS to 0",
                check_id="django_rlock.E010",
            )

    def _accepted_options(self) -> tuple[Mapping[str, object], str]:
        """The OPTIONS this alias's client takes, with defaults, and what takes them."""
        return connection_options(self.location), "redis-py's client for its LOCATION"

    @property
    def client(self) -> LockClient:
        """The engine's client for this alias: built on first use, shared by all threads."""
        client = self._client
        if client is None:
            with self._build_lock:
                client = self._client
                if client is None:
                    client = self._client = self._connect()
                    # Once per server and process, off this thread: an evicting
                    # policy makes locks vanish under memory pressure.
                    report_eviction_policy(client)
        return client

    def _connect(self) -> LockClient:
        if self.cache_alias is not None:
            prefix = self.key_prefix if "KEY_PREFIX" in self.params else None
            shared = lock_client_for(
                self.cache_alias,
                key_prefix=prefix,
                watchdog_timeout=self.watchdog_timeout,
                deadlock_timeout=self.deadlock_timeout,
            )
            self.reporter.attach(shared.holds)
            return shared
        try:
            self._redis = from_url(self.location, **self.options)
        except (TypeError, ValueError) as error:
            raise LockSettingError(
                f"RLOCKS[{self.alias!r}]: cannot build a redis client from LOCATION and "
                f"OPTIONS: {error}",
                check_id="django_rlock.E003",
            ) from None
        client = LockClient(
            self._redis,
            key_prefix=self.key_prefix,
            watchdog_timeout=self.watchdog_timeout,
            deadlock_timeout=self.deadlock_timeout,
            min_replicas=self.min_replicas,
            replica_sync_timeout=self.replica_sync_timeout,
            server=self.server_label(),
            layout=self.layout,
            sharded_subscription=self.sharded_subscription,
        )
        self.reporter.attach(client.holds)
        return client

    def server_label(self) -> str:
        """How errors name this alias's server: the alias, and the URL without credentials."""
        return f"RLOCKS[{self.alias!r}] ({redact_url(self.location)})"

    def lock(self, name: str, **options: Unpack[LockOptions]) -> AliasLock:
        """A reentrant Redis lock called ``name`` (see :meth:`BaseLockBackend.lock`)."""
        warn_unformatted_from_user(name, stacklevel=2)  # as rlock() warns
        kind = RedissonAliasLock if self.layout == REDISSON else AliasLock
        return kind(self.client, check_name(name), backend=self, **options)

    def async_lock(self, name: str, **options: Unpack[LockOptions]) -> AsyncLock:
        """The asyncio twin of :meth:`lock`, owned by the current task (no thread hop)."""
        if not self._native_async():
            return super().async_lock(name, **options)
        kind = AsyncRedissonAliasLock if self.layout == REDISSON else AsyncAliasLock
        return kind(self._async_client(), check_name(name), backend=self, **options)

    def semaphore(self, name: str, permits: int, **options: Unpack[LockOptions]) -> AliasSemaphore:
        """A Redis semaphore called ``name`` (see :meth:`BaseLockBackend.semaphore`)."""
        warn_unformatted_from_user(name, stacklevel=2)
        return AliasSemaphore(self.client, check_name(name), permits, backend=self, **options)

    def async_semaphore(self, name: str, permits: int, **options: Unpack[LockOptions]) -> AsyncLock:
        """The asyncio twin of :meth:`semaphore`, owned by the current task (no thread hop)."""
        if not self._native_async():
            return super().async_semaphore(name, permits, **options)
        return AsyncAliasSemaphore(
            self._async_client(), check_name(name), permits, backend=self, **options
        )

    def fair_lock(self, name: str, **options: Unpack[LockOptions]) -> AliasFairLock:
        """A Redis lock called ``name``, granted in arrival order (see BaseLockBackend).

        Refused (ValueError) on an alias with ``MIN_REPLICAS``, as the engine's is.
        """
        warn_unformatted_from_user(name, stacklevel=2)
        return AliasFairLock(self.client, check_name(name), backend=self, **options)

    def async_fair_lock(self, name: str, **options: Unpack[LockOptions]) -> AsyncLock:
        """The asyncio twin of :meth:`fair_lock`, owned by the current task (no thread hop)."""
        if not self._native_async():
            return super().async_fair_lock(name, **options)
        return AsyncAliasFairLock(self._async_client(), check_name(name), backend=self, **options)

    def read_write_lock(self, name: str, **options: Unpack[LockOptions]) -> AliasReadWriteLock:
        """A Redis read-write lock called ``name`` (see :meth:`BaseLockBackend.read_write_lock`).

        Refused (ValueError) on an alias with ``MIN_REPLICAS``, as the engine's is.
        """
        warn_unformatted_from_user(name, stacklevel=2)
        return AliasReadWriteLock(self.client, check_name(name), backend=self, **options)

    def async_read_write_lock(
        self, name: str, **options: Unpack[LockOptions]
    ) -> AsyncReadWriteLock:
        """The asyncio twin of :meth:`read_write_lock`, each side owned by the current task."""
        if not self._native_async():
            return super().async_read_write_lock(name, **options)
        return AsyncAliasReadWriteLock(
            self._async_client(), check_name(name), backend=self, **options
        )

    def rate_limiter(self, name: str, rate: str, burst: int | None = None) -> AliasRateLimiter:
        """A Redis rate limiter called ``name`` (see :meth:`BaseLockBackend.rate_limiter`)."""
        return AliasRateLimiter(self.client, check_name(name), rate, self, burst=burst)

    def async_rate_limiter(self, name: str, rate: str, burst: int | None = None) -> AsyncLimiter:
        """The asyncio twin of :meth:`rate_limiter` (no thread hop where the alias allows)."""
        if not self._native_async():
            return super().async_rate_limiter(name, rate, burst)
        return AsyncAliasRateLimiter(
            self._async_client(), check_name(name), rate, self, burst=burst
        )

    def inspect_rate_limiter(self, name: str) -> LimiterState | None:
        """Rate limiter ``name``'s debt, interval and burst, read in one script call."""
        return read_limiter_state(self.client, check_name(name))

    def _native_async(self) -> bool:
        """Whether this alias has the asyncio engine (if not: a lock on a worker thread)."""
        # A cache alias shares the cache's sync pool, which asyncio cannot use;
        # Sentinel, Cluster and replica-synced grants have no asyncio engine yet.
        # The asyncio listener has no SSUBSCRIBE (SHARDED_SUBSCRIPTION "on").
        return (
            self.cache_alias is None
            and not self.min_replicas
            and self.location.startswith(_ASYNC_SCHEMES)
            and self.sharded_subscription != "on"
        )

    def _async_client(self) -> AsyncLockClient:
        return self._async_clients.get(self._build_async_client)

    def _async_pool(self) -> redis.asyncio.BlockingConnectionPool:
        """The connection pool of a new asyncio client (one per event loop)."""
        return redis.asyncio.BlockingConnectionPool.from_url(
            self.location, timeout=None, **self.options
        )

    def _build_async_client(self) -> AsyncLockClient:
        try:
            pool = self._async_pool()
        except (TypeError, ValueError) as error:
            raise LockSettingError(
                f"RLOCKS[{self.alias!r}]: cannot build an asyncio redis client from "
                f"LOCATION and OPTIONS: {error}",
                check_id="django_rlock.E003",
            ) from None
        client = AsyncLockClient(
            redis.asyncio.Redis(connection_pool=pool),
            key_prefix=self.key_prefix,
            watchdog_timeout=self.watchdog_timeout,
            deadlock_timeout=self.deadlock_timeout,
            server=self.server_label(),
            layout=self.layout,
            sharded_subscription=self.sharded_subscription,
        )
        self.reporter.attach(client.engine.holds)
        return client

    def names(self, pattern: str = "*") -> Iterator[str]:
        """Held lock names matching ``pattern``, found with SCAN (never KEYS).

        With ``LAYOUT`` ``"redisson"`` a name is its own key, so only the names
        this library's processes hold are found (by their holder descriptions).
        """
        client = self.client
        if self.layout == REDISSON:
            yield from self._redisson_names(pattern)
            return
        prefix = client.key_prefix
        head = f"{_glob_escape(prefix)}:" if prefix else ""
        match = f"{head}{{{escape(pattern)}}}"
        seen: set[str] = set()
        with reported_unavailable(client.server, "list locks"):
            for raw in client.redis.scan_iter(match=match, count=_SCAN_BATCH, _type="hash"):
                key = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw
                name = LockKeys.name_of(prefix, key)
                if name is not None and name not in seen:
                    seen.add(name)  # SCAN may return a key twice
                    yield name

    def _redisson_names(self, pattern: str) -> Iterator[str]:
        client = self.client
        prefix = client.key_prefix
        head = f"{prefix}:redisson:" if prefix else "redisson:"
        tail = ":holder"
        seen: set[str] = set()
        with reported_unavailable(client.server, "list locks"):
            for raw in client.redis.scan_iter(
                match=f"{_glob_escape(head)}*{tail}", count=_SCAN_BATCH, _type="hash"
            ):
                own = _text(raw)[len(head) : -len(tail)]
                if own.startswith("tag:"):
                    name = own[len("tag:") :]
                elif own.startswith("{") and own.endswith("}"):
                    name = own[1:-1]
                else:
                    continue
                if name not in seen and fnmatchcase(name, pattern):
                    seen.add(name)  # SCAN may return a key twice
                    yield name

    def inspect(self, name: str) -> LockInfo | None:
        """Holders, TTL and last fencing token of lock ``name``, read in one round trip."""
        client = self.client
        if self.layout == REDISSON:
            return self._inspect_redisson(name)
        keys = LockKeys.build(client.key_prefix, check_name(name))
        pipe = client.redis.pipeline(transaction=False)
        pipe.hgetall(keys.hash)
        pipe.pttl(keys.hash)
        pipe.get(keys.fence)
        pipe.zcard(keys.waiters)
        _read_time(pipe, client.cluster is None)
        with reported_unavailable(client.server, "inspect", keys.name):
            owners, pttl, fence, waiters, *clock = pipe.execute()
        fields = {_text(key): _text(value) for key, value in owners.items()}
        holders = {
            display_owner(owner): int(count)
            for owner, count in fields.items()
            if not is_holder_field(owner)
        }
        if not holders:
            return None
        ttl = float("inf") if pttl == -1 else max(int(pttl), 0) / 1000
        return LockInfo(
            name=name,
            holders=holders,
            ttl=ttl,
            token=_token(fields.get(TOKEN_FIELD), fence),
            waiters=int(waiters),
            holder=read_holder(fields),
            read_at=_server_time(clock),
            lease=_lease_of(fields),
        )

    def _inspect_redisson(self, name: str) -> LockInfo | None:
        """:meth:`inspect` in Redisson's layout: either side's holders; no waiters are known."""
        client = self.client
        keys = redisson_keys(client.key_prefix, check_redisson_name(check_name(name)))
        pipe = client.redis.pipeline(transaction=False)
        pipe.hgetall(keys.hash)
        pipe.pttl(keys.hash)
        pipe.get(keys.token)
        pipe.hgetall(keys.holder)
        _read_time(pipe, client.cluster is None)
        with reported_unavailable(client.server, "inspect", keys.name):
            owners, pttl, token, description, *clock = pipe.execute()
        holders = {display_owner(_text(owner)): int(count) for owner, count in owners.items()}
        if not holders:
            return None
        described = {_text(k): _text(v) for k, v in description.items()}
        ttl = float("inf") if pttl == -1 else max(int(pttl), 0) / 1000
        return LockInfo(
            name=name,
            holders=holders,
            ttl=ttl,
            token=None if token is None else int(token),
            waiters=0,  # Redisson's waiters register nowhere
            holder=read_holder(described),
            read_at=_server_time(clock),
            lease=_lease_of(described),
        )

    def maxmemory_policy(self) -> str | None:
        """The server's ``maxmemory-policy`` (5 s at most): CONFIG GET, else INFO memory.

        INFO is the fallback where CONFIG is refused (an ACL user without
        ``+config``, managed services); see
        :func:`django_rlock._observers.eviction.maxmemory_policy`.
        """
        # Its own short-timeout connection: a deploy check must not hang on a
        # server that does not answer, whatever timeouts the alias's OPTIONS set.
        probe = derive_client(
            self.client.cluster or self.client.redis,
            socket_timeout=_PROBE_SECONDS,
            socket_connect_timeout=_PROBE_SECONDS,
        )
        try:
            return read_maxmemory_policy(probe)
        finally:
            probe.close()
            if isinstance(probe, redis.Redis):
                probe.connection_pool.disconnect()

    def close(self) -> None:
        """Close the connections this backend made (a cache's client is the cache's)."""
        with self._build_lock:
            client, self._client = self._client, None
            built, self._redis = self._redis, None
        if client is not None and built is None:
            self.reporter.detach(client.holds)  # the cache's client lives on
        if client is not None and built is not None:
            client.close()
            built.close()
            if isinstance(built, redis.Redis):  # a RedisCluster's close() closes its pools
                built.connection_pool.disconnect()
        # Their event loops may be gone: stop renewing; connections die with them.
        self._async_clients.close_all()


def _read_time(pipe: Any, single: bool) -> None:
    """Add TIME to an inspect's pipeline: "held for" by the clock that stamped the grant.

    Only on a single server: a cluster pipeline groups its commands by slot,
    and TIME has none (the inspect then falls back on this machine's clock).
    """
    if single:
        pipe.time()


def _server_time(clock: list[Any]) -> datetime | None:
    """The server's TIME reply (seconds, microseconds) as an aware datetime; None if unread."""
    if not clock:
        return None
    seconds, micros = clock[0]
    return datetime.fromtimestamp(int(seconds) + int(micros) / 1_000_000, UTC)


def _lease_of(fields: Mapping[str, str]) -> float | None:
    """The fixed lease a hold's description records (None: a watchdog hold, or none)."""
    hold = read_hold(*(fields.get(field) for field in DESCRIPTION_FIELDS))
    return None if hold is None else hold["lease"]
