"""A lock server that may evict lock keys: read its policy, and say so once.

Every lock key carries a TTL (the watchdog's or the lease), so any
``maxmemory-policy`` but ``noeviction`` can drop a held lock under memory
pressure, the ``volatile-*`` policies first of all: the lock is then free for
a rival while its holder still works under it, until the watchdog's next
renewal tells the holder (see docs/guarantees.md, "Eviction").

:func:`maxmemory_policy` reads the policy with ``CONFIG GET``, or where CONFIG
is refused (an ACL user without ``+config``, managed services that rename or
block it) from ``INFO memory``. :func:`report_eviction_policy` logs an ERROR
on ``django_rlock.lock``, once per server per process, when a lock server's
policy can evict; a backend calls it as it connects. It never fails and never
delays the caller: the probe runs on a short-lived thread of its own, with
short timeouts, and its errors go to the debug log.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

import redis

from django_rlock.core import LockClient
from django_rlock.core._faces import RedisClient, derive_client, describe, forking

logger = logging.getLogger("django_rlock.lock")

#: The one policy that never evicts a key (writes fail with OOM instead).
SAFE_POLICY = "noeviction"

#: Socket timeouts of the background probe, in seconds: a server that does not
#: answer this fast is not worth waiting for (the deploy check reads it too).
PROBE_SECONDS = 2.0

# Servers already probed by this process (see describe()); emptied in a forked
# child, which is a process of its own and says it again.
_probed: set[str] = set()
_probed_mutex = threading.Lock()


@forking.after_fork_in_child
def _forget_probed() -> None:
    global _probed_mutex  # noqa: PLW0603 -- a lock held across fork() must be remade
    _probed.clear()
    _probed_mutex = threading.Lock()


def can_evict(policy: str) -> bool:
    """Whether ``policy`` may evict lock keys (all of which carry a TTL)."""
    return policy != SAFE_POLICY


def maxmemory_policy(client: RedisClient) -> str | None:
    """The server's ``maxmemory-policy``: CONFIG GET, else INFO memory's ``maxmemory_policy``.

    None when the server reports neither. Raises ``redis.RedisError`` when both
    are refused or the server does not answer (the error of the INFO call,
    chained to CONFIG's). On a cluster, the policy of a node that can evict
    wins (each node has its own).
    """
    try:
        reply = client.config_get("maxmemory-policy")
    except redis.ResponseError as refused:
        # NOPERM for an ACL user without +config; "unknown command" where a
        # managed service renamed CONFIG. INFO is usually still allowed.
        try:
            info = client.info("memory")
        except redis.RedisError as error:
            raise error from refused
        return _policy_of(info, "maxmemory_policy")
    return _policy_of(reply, "maxmemory-policy")


def _policy_of(reply: Mapping[Any, Any], field: str) -> str | None:
    """The policy in a CONFIG GET or INFO reply (a cluster's: one reply per node)."""
    policies: list[str] = []
    for key, value in reply.items():
        if _text(key) == field:
            policies.append(_text(value))
        elif isinstance(value, Mapping):  # a cluster's reply, keyed by node
            policy = _policy_of(value, field)
            if policy is not None:
                policies.append(policy)
    evicting = [policy for policy in policies if can_evict(policy)]
    found = evicting or policies
    return found[0] if found else None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def report_eviction_policy(client: LockClient) -> threading.Thread | None:
    """Log an ERROR if ``client``'s server may evict lock keys; once per server per process.

    Call it when a lock client connects. The policy is read on a daemon
    thread (returned, for tests to join; None when this server was already
    probed), so the caller never waits for it; any error there is logged at
    DEBUG and forgotten.
    """
    target = client.cluster or client.redis
    server = describe(target)
    with _probed_mutex:
        if server in _probed:
            return None
        _probed.add(server)
    probe = threading.Thread(
        target=_probe,
        args=(target, client.server),
        name=f"rlock-eviction-probe {server}",
        daemon=True,
    )
    probe.start()
    return probe


def _probe(target: RedisClient, server: str) -> None:
    try:
        client = derive_client(
            target, socket_timeout=PROBE_SECONDS, socket_connect_timeout=PROBE_SECONDS
        )
        try:
            policy = maxmemory_policy(client)
        finally:
            client.close()
            if isinstance(client, redis.Redis):
                client.connection_pool.disconnect()
    except Exception as error:  # noqa: BLE001 -- a warning's probe must never fail anything
        logger.debug("could not read the maxmemory-policy of lock server %s: %s", server, error)
        return
    if policy is not None and can_evict(policy):
        logger.error(
            "lock server %s has maxmemory-policy %r: under memory pressure Redis evicts keys "
            "with a TTL, and every lock key has one. An evicted lock is free at once: a rival "
            "can take it while its holder still works under it, until the watchdog's next "
            "renewal tells the holder it was lost. Run locks on a server with "
            "maxmemory-policy noeviction (a Redis or database of their own; "
            "CONFIG SET maxmemory-policy noeviction). See docs/guarantees.md, 'Eviction'.",
            server,
            policy,
            extra={"lock_server": server, "maxmemory_policy": policy},
        )
