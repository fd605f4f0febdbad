"""Redis Cluster: per-slot grouping and the per-node release listener.

On a cluster every key and channel of one lock shares one hash slot (see
:mod:`django_rlock.core._protocol.names`), so two things follow:

* One EVAL may only touch keys of one slot: the watchdog renews a cluster
  client's holds in batches grouped by :func:`slot_of`.
* On Redis >= 7 a release is announced with SPUBLISH, which only the nodes of
  the channel's shard hear. A waiter must therefore SSUBSCRIBE on the node
  that owns the slot. :class:`ShardedReleaseListener` keeps one
  :class:`~django_rlock.core._sync.waiting.ReleaseListener` (one pub/sub connection,
  read by the waiting threads themselves) per node that has waiters, and sends
  each waiter to the node owning its channel's slot at the time it starts
  waiting. If the slot moves while it waits (resharding, failover), the node
  drops the subscription and the waiter falls back to waiting out the holder's
  PTTL, as it does for any lost message: it may wake late, never hang.

Older clusters (< 7) have no sharded pub/sub: there a PUBLISH reaches every
node, and one plain listener on any node serves all locks.
"""

from __future__ import annotations

import itertools
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from redis.cluster import RedisCluster
from redis.crc import key_slot

from django_rlock.core._sync.waiting import ReleaseListener, Subscription


def slot_of(key: str) -> int:
    """The Redis Cluster hash slot of ``key``."""
    return key_slot(key.encode("utf-8"))


class ShardedReleaseListener:
    """Release listening on a cluster with sharded pub/sub: one listener per node."""

    def __init__(self, cluster: RedisCluster) -> None:
        self._cluster = cluster
        self._lock = threading.Lock()
        self._listeners: dict[str, ReleaseListener] = {}
        self._closed = False
        # Waiter ids handed out before the node is known (a fair lock's queue
        # id): a prefix of this listener's own never meets a node listener's.
        self._id = secrets.token_hex(8)
        self._sequence = itertools.count()

    def new_waiter_id(self) -> str:
        """A waiter id unique among this client's listeners (see ReleaseListener.new_waiter_id)."""
        return f"{self._id}:{next(self._sequence)}"

    @contextmanager
    def listen(self, channel_name: str, waiter_id: str = "") -> Iterator[Subscription]:
        """SSUBSCRIBE to ``channel_name`` on the node owning its slot, for the block."""
        with self._listener_for(channel_name).listen(channel_name, waiter_id) as subscription:
            yield subscription

    def subscribed_channels(self) -> set[bytes]:
        """Channels with a subscription in force on any node."""
        with self._lock:
            listeners = list(self._listeners.values())
        return set().union(*(listener.subscribed_channels() for listener in listeners))

    def close(self) -> None:
        """Close every node's connection. Threads still waiting fall back to PTTL waits."""
        with self._lock:
            self._closed = True
            listeners, self._listeners = list(self._listeners.values()), {}
        for listener in listeners:
            listener.close()

    def _listener_for(self, channel_name: str) -> ReleaseListener:
        node = self._cluster.nodes_manager.get_node_from_slot(slot_of(channel_name))
        with self._lock:
            if self._closed:
                raise RuntimeError("the lock client is closed")
            listener = self._listeners.get(node.name)
            if listener is None:
                node_client = self._cluster.get_redis_connection(node)
                listener = ReleaseListener(node_client, sharded=True)
                self._listeners[node.name] = listener
            return listener
