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

While a slot moves, Redis refuses the scripts on its keys: TRYAGAIN or ASK
for as long as the slot is half-moved (every lock script names a key that
may not exist, so it never has all of its keys on one side), MOVED until the
clients have the new map after a failover, CLUSTERDOWN while no primary
serves it. redis-py follows redirections and retries TRYAGAIN for about 0.4 s,
then gives up (``ClusterError: TTL exhausted.``). A refused call did not run,
and acquire and release carry a request id their latch knows, so sending the
same call again is safe: :func:`resend_while_settling` does so, with a
bounded backoff, until the caller's bound (an acquire's timeout; for a
release, as long as the hold would have lived anyway).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import ClusterError

from django_rlock.core._protocol import clock
from django_rlock.core._protocol.channels import new_wake_name
from django_rlock.core._protocol.unavailable import SLOT_MOVING, refused_for_slot
from django_rlock.core._sync.waiting import ReleaseListener, Subscription

T = TypeVar("T")

#: The first pause before a refused call is sent again, in seconds; it doubles
#: up to :data:`_LONGEST_PAUSE`. Each refusal already cost redis-py's own
#: tries (about 0.4 s for TRYAGAIN), so a short pause is enough.
_FIRST_PAUSE = 0.02
_LONGEST_PAUSE = 0.25


def slot_of(key: str) -> int:
    """The Redis Cluster hash slot of ``key``."""
    return key_slot(key.encode("utf-8"))


def resend_while_settling(send: Callable[[], T], until: float) -> T:
    """``send()``; while the cluster refuses it for a moving slot, send it again until ``until``.

    ``until`` is a finite :func:`~django_rlock.core._protocol.clock.monotonic` time; the
    last pause ends at it, so a call sent after it is never made (at or before
    the first send's time: one send). ``send`` must resend the very same call
    (one request id), which a refusal never ran. What is still refused at
    ``until`` is raised, a script's refused key as a ``ClusterError`` (so that
    :data:`~django_rlock.core._protocol.unavailable.UNREACHABLE` takes it);
    every other error at once.
    """
    pause = _FIRST_PAUSE
    while True:  # bounded: each round ends by `until` or returns
        try:
            return send()
        except Exception as error:
            if not refused_for_slot(error):
                raise
            left = until - clock.monotonic()
            if left <= 0:
                if isinstance(error, SLOT_MOVING):
                    raise
                raise ClusterError(f"the slot is moving: {error}") from error
        time.sleep(min(pause, left))
        pause = min(pause * 2, _LONGEST_PAUSE)


class ShardedReleaseListener:
    """Release listening on a cluster with sharded pub/sub: one listener per node."""

    def __init__(self, cluster: RedisCluster) -> None:
        self._cluster = cluster
        self._lock = threading.Lock()
        self._listeners: dict[str, ReleaseListener] = {}
        self._closed = False
        # Waiter ids handed out before the node is known (a fair lock's queue
        # id): a prefix of this listener's own never meets a node listener's.
        # It is a wake name, so the node listener that subscribes the id
        # subscribes its wake channel too (in the lock's slot, on that node).
        self._id = new_wake_name()
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

    @property
    def messages(self) -> int:
        """Release messages read by every node's listener (diagnostics and benchmarks)."""
        with self._lock:
            listeners = list(self._listeners.values())
        return sum(listener.messages for listener in listeners)

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
