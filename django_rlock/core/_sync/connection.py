"""Building the Redis clients the engine uses next to the caller's own.

The caller's client runs acquire, release and inspection, with whatever retry
policy the caller chose. Two paths need different rules and get their own
connections, derived from the caller's connection settings:

* renewal: no hidden retries and a short socket timeout, so no renewal can
  block past the deadline at which its lock must be declared lost;
* pub/sub: a dedicated connection whose reads belong to the waiting threads.

Three deployments are understood, each from a URL or from a client built by
the caller:

* one server: ``redis://``, ``rediss://``, ``unix://`` or a ``redis.Redis``;
* Sentinel: ``redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]``
  or a ``redis.Redis`` made by ``Sentinel.master_for``. Derived connections use a
  sentinel-managed pool too, so renewal and pub/sub follow a failover;
* Redis Cluster: ``redis+cluster://[user:password@]host:port[,host:port...]`` (any
  nodes, used as seeds) or a ``redis.cluster.RedisCluster``.

The ``rediss+sentinel://`` and ``rediss+cluster://`` forms use TLS. Query
options (``?socket_timeout=5``) are connection options, as in ``redis://`` URLs;
for Sentinel, ``sentinel_username`` and ``sentinel_password`` authenticate to
the sentinels, which otherwise share the master's socket timeouts.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import AbstractConnection, parse_url
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from django_rlock.core._protocol.urls import redact_url

#: What the engine talks to: one server (possibly sentinel-managed) or a cluster.
RedisClient = redis.Redis | RedisCluster


SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")


CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")


_SENTINEL_ONLY = ("sentinel_username", "sentinel_password")


def connect(connection: str | RedisClient) -> tuple[RedisClient, bool]:
    """Return ``(client, owned)`` for a URL or an existing client.

    ``owned`` tells whether the engine built the client (and must close it).
    """
    if isinstance(connection, str):
        if not connection:
            raise ValueError("connection must be a redis URL or a redis.Redis, got ''")
        return from_url(connection), True
    if isinstance(connection, redis.Redis | RedisCluster):
        return connection, False
    raise ValueError(
        "connection must be a redis URL, a redis.Redis or a RedisCluster, "
        f"not {type(connection).__name__}"
    )


def from_url(url: str, **options: Any) -> RedisClient:
    """A client for any URL form in the module docstring; ``options`` are connection options."""
    scheme = url.partition("://")[0].lower()
    try:
        if scheme in SENTINEL_SCHEMES:
            return _sentinel_from_url(url, options)
        if scheme in CLUSTER_SCHEMES:
            return _cluster_from_url(url, options)
        return redis.Redis.from_url(url, **options)
    except ValueError as error:
        raise ValueError(f"invalid redis URL {redact_url(url)!r}: {error}") from None


def connection_options(url: str) -> Mapping[str, object]:
    """The keyword options a client for ``url`` accepts (see :func:`from_url`), with defaults.

    Read from redis-py's own signatures (the client, its connection pool and
    connection classes; RedisCluster's for a cluster URL), so the set follows
    the installed redis-py; a default is ``inspect.Parameter.empty`` when there
    is none. Sentinel URLs also take ``sentinel_username`` and ``sentinel_password``.
    """
    scheme = url.partition("://")[0].lower()
    if scheme in CLUSTER_SCHEMES:
        return _options_of("cluster")
    return _options_of("sentinel" if scheme in SENTINEL_SCHEMES else "")


@functools.cache
def _options_of(kind: str) -> Mapping[str, object]:
    classes: list[Any] = [
        redis.Redis,
        redis.ConnectionPool,
        AbstractConnection,
        redis.Connection,
        redis.SSLConnection,
        redis.UnixDomainSocketConnection,
    ]
    if kind == "cluster":
        classes.append(RedisCluster)
    options: dict[str, object] = {}
    for cls in classes:
        for name, parameter in inspect.signature(cls.__init__).parameters.items():
            if name != "self" and parameter.kind in (
                parameter.KEYWORD_ONLY,
                parameter.POSITIONAL_OR_KEYWORD,
            ):
                default = parameter.default
                if default is None and _numeric(parameter.annotation):
                    # Older redis-py (5.x) defaults e.g. socket_timeout to None where
                    # newer ones give a number: its type still says what it takes.
                    default = 0.0
                if options.get(name) in (None, inspect.Parameter.empty):
                    options[name] = default
    if kind == "sentinel":
        options.update(dict.fromkeys(_SENTINEL_ONLY))
    return MappingProxyType(options)


_NUMERIC = re.compile(r"Optional\[(float|int)\]|(float|int)( \| None)?|None \| (float|int)")


def _numeric(annotation: object) -> bool:
    """Whether an annotation reads ``Optional[float]`` / ``int | None`` (a number or None)."""
    text = (annotation if isinstance(annotation, str) else repr(annotation)).replace("typing.", "")
    return bool(_NUMERIC.fullmatch(text))


def _requires_command_name() -> bool:
    parameter = inspect.signature(redis.ConnectionPool.get_connection).parameters["command_name"]
    return parameter.default is inspect.Parameter.empty


#: What ``pool.get_connection()`` is called with: redis-py before 5.3 requires a
#: command name (it ignores it); later ones deprecate passing one.
GET_CONNECTION_ARGS: tuple[str, ...] = ("PING",) if _requires_command_name() else ()


def check_url(url: str) -> None:
    """Raise ValueError if ``url`` is not one of the URL forms above (nothing is contacted)."""
    scheme = url.partition("://")[0].lower()
    try:
        if scheme in SENTINEL_SCHEMES or scheme in CLUSTER_SCHEMES:
            _, path, _ = _split_multi_host_url(url)
            segments = [segment for segment in path.split("/") if segment]
            if scheme in SENTINEL_SCHEMES and not 1 <= len(segments) <= 2:
                raise ValueError("a sentinel URL's path is /<service name>[/<db>]")
        else:
            parse_url(url)  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
    except ValueError as error:
        raise ValueError(f"invalid redis URL {redact_url(url)!r}: {error}") from None


def _split_multi_host_url(url: str) -> tuple[list[tuple[str, int]], str, dict[str, Any]]:
    """``(hosts, path, options)`` of a URL whose netloc lists several ``host:port``."""
    parts = urlsplit(url)
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    hosts: list[tuple[str, int]] = []
    for item in hostlist.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"expected host:port, got {item!r}")
        hosts.append((unquote(host.strip("[]")), int(port)))
    secure = parts.scheme.lower().startswith("rediss")
    # redis-py's own parser reads the user, password and typed query options;
    # the host it is shown is a placeholder.
    plain = f"{'rediss' if secure else 'redis'}://{userinfo + '@' if userinfo else ''}placeholder"
    options: dict[str, Any] = parse_url(plain + (f"?{parts.query}" if parts.query else ""))  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
    options.pop("host", None)
    if secure:
        options.pop("connection_class", None)
        options["ssl"] = True
    return hosts, parts.path, options


def _sentinel_from_url(url: str, options: dict[str, Any]) -> redis.Redis:
    hosts, path, parsed = _split_multi_host_url(url)
    segments = [unquote(segment) for segment in path.split("/") if segment]
    if not segments or len(segments) > 2:
        raise ValueError("a sentinel URL's path is /<service name>[/<db>]")
    service = segments[0]
    if len(segments) == 2:
        if not segments[1].isdigit():
            raise ValueError(f"the database must be a number, got {segments[1]!r}")
        parsed.setdefault("db", int(segments[1]))
    kwargs = {**parsed, **options}
    sentinel_kwargs = {
        key.removeprefix("sentinel_"): kwargs.pop(key) for key in _SENTINEL_ONLY if key in kwargs
    }
    # Discovery must not hang longer than a command would.
    for key in ("socket_timeout", "socket_connect_timeout", "ssl"):
        if key in kwargs:
            sentinel_kwargs.setdefault(key, kwargs[key])
    sentinel = Sentinel(hosts, sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call, unused-ignore]  # untyped before redis-py 8.2
    master: redis.Redis = sentinel.master_for(service, **kwargs)  # type: ignore[no-untyped-call, unused-ignore]
    return master


def _cluster_from_url(url: str, options: dict[str, Any]) -> RedisCluster:
    hosts, path, parsed = _split_multi_host_url(url)
    if path.strip("/") not in ("", "0"):
        raise ValueError("Redis Cluster has only database 0")
    parsed.pop("db", None)
    seeds = [ClusterNode(host, port) for host, port in hosts]  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
    return RedisCluster(startup_nodes=seeds, **{**parsed, **options})


def _settings_of(pool: redis.ConnectionPool) -> dict[str, Any]:
    return {
        key: value
        for key, value in pool.connection_kwargs.items()
        # State a pool attaches to its own connections, not connection settings.
        if not key.startswith(("orig_", "maint_notifications_pool", "oss_cluster_maint"))
        and key != "connection_pool"
    }


def connection_settings(client: RedisClient) -> dict[str, Any]:
    """The keyword arguments the client's connections are made with."""
    if isinstance(client, RedisCluster):
        return _settings_of(any_node_client(client).connection_pool)
    return _settings_of(client.connection_pool)


_NO_RETRIES: dict[str, Any] = {"retry_on_timeout": False, "retry_on_error": []}


def derive_pool(client: redis.Redis, **overrides: Any) -> redis.ConnectionPool:
    """A new pool to the same server as ``client``, with ``overrides`` applied.

    Retries are always switched off: a derived connection reports the first
    error to the engine, which decides what to do by its own deadlines. A
    sentinel-managed client gets a sentinel-managed pool, which asks the
    sentinels for the current master whenever it connects.
    """
    pool = client.connection_pool
    kwargs = _settings_of(pool)
    kwargs.update(retry=Retry(NoBackoff(), 0), decode_responses=False, **_NO_RETRIES)
    kwargs.update(overrides)
    if isinstance(pool, SentinelConnectionPool):
        return SentinelConnectionPool(  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
            pool.service_name,
            pool.sentinel_manager,
            is_master=pool.is_master,
            check_connection=pool.check_connection,
            connection_class=pool.connection_class,
            **kwargs,
        )
    return redis.ConnectionPool(connection_class=pool.connection_class, **kwargs)


def derive_client(client: RedisClient, **overrides: Any) -> RedisClient:
    """A new client of the same server or cluster, with no retries and ``overrides``.

    For a cluster, every known node is a seed and redirections (MOVED, ASK)
    are still followed; connection errors and timeouts are not retried, on
    every redis-py line.
    """
    if isinstance(client, RedisCluster):
        kwargs = {
            key: value
            for key, value in connection_settings(client).items()
            if key not in ("host", "port", "db", "redis_connect_func", "connection_class")
            and key not in _NO_RETRIES
            and key != "retry"
        }
        kwargs.update(decode_responses=False)
        kwargs.update(overrides)
        seeds = [ClusterNode(node.host, node.port) for node in primaries(client)]  # type: ignore[no-untyped-call]
        derived = RedisCluster(startup_nodes=seeds, retry=Retry(NoBackoff(), 0), **kwargs)
        if "cluster_error_retry_attempts" in vars(derived):
            # redis-py before 6 retries a cluster call (a connection error, a
            # timeout) this many times more, whatever its `retry`: a renewal
            # would take four socket timeouts where its deadline allows one.
            vars(derived)["cluster_error_retry_attempts"] = 0  # not in every line's stubs
        return derived
    return redis.Redis(connection_pool=derive_pool(client, **overrides))


def server_major_version(client: redis.Redis) -> int:
    """The major version of the server ``client`` talks to (INFO server)."""
    version = str(client.info("server").get("redis_version", "0"))
    major = version.split(".", 1)[0]
    return int(major) if major.isdigit() else 0


def primaries(cluster: RedisCluster) -> list[ClusterNode]:
    """The cluster's primary nodes, as last discovered."""
    nodes: list[ClusterNode] = cluster.get_primaries()  # type: ignore[no-untyped-call]
    return nodes


def node_client_for_key(cluster: RedisCluster, key: str) -> redis.Redis:
    """The client of the primary owning ``key``'s slot."""
    node: ClusterNode = cluster.get_node_from_key(key)  # type: ignore[no-untyped-call]
    return cluster.get_redis_connection(node)


def any_node_client(cluster: RedisCluster) -> redis.Redis:
    """The client of the cluster's default node."""
    node: ClusterNode = cluster.get_default_node()  # type: ignore[no-untyped-call]
    return cluster.get_redis_connection(node)


def describe(client: RedisClient) -> str:
    """The server a client talks to, for error messages (never credentials)."""
    if isinstance(client, RedisCluster):
        return "cluster " + ",".join(node.name for node in primaries(client))
    pool = client.connection_pool
    if isinstance(pool, SentinelConnectionPool):
        return f"sentinel service {pool.service_name}"
    kwargs = pool.connection_kwargs
    if "path" in kwargs:
        return f"unix:{kwargs['path']}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
