"""Redis Cluster: per-slot grouping and the per-node release listener.

On a cluster every key and channel of one lock shares one hash slot (see
:mod:`django_rlock.core._protocol.names`), so two things follow:

* One EVAL may only touch keys of one slot: the watchdog renews a cluster
  client's holds in batches grouped by :func:`slot_of`, each node's batches
  sent as one pipeline (:mod:`~django_rlock.core._sync.noderounds`).
* On Redis >= 7 a release is announced with SPUBLISH, which only the nodes of
  the channel's shard hear. A waiter must therefore SSUBSCRIBE on the node
  that owns the slot. :class:`ShardedReleaseListener` keeps one
  :class:`~django_rlock.core._sync.waiting.ReleaseListener` (one pub/sub connection,
  read by the waiting threads themselves) per node that has waiters, and sends
  each waiter to the node owning its channel's slot. If the slot moves while
  it waits (a reshard, a failover), the node drops the subscription (an
  unasked SUNSUBSCRIBE) or refuses it (MOVED); the waiter is woken, and its
  :class:`ShardedSubscription` asks that node where the slot went and
  subscribes there before the waiter retries the acquire. A release made
  while it was subscribed nowhere is found by that retry, so no wake-up is
  lost, and a release after it reaches the new subscription.

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
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import TypeVar

from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from redis.exceptions import ClusterError

from django_rlock.core._protocol import clock
from django_rlock.core._protocol.channels import new_wake_name
from django_rlock.core._protocol.unavailable import SLOT_MOVING, refused_for_slot
from django_rlock.core._sync.waiting import ReleaseListener, Subscription

T = TypeVar("T")

logger = logging.getLogger("django_rlock.waiting")

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
        self._id = new_wake_name(hand_over=False)
        self._sequence = itertools.count()
        # Slot map refreshes made for moved subscriptions (see _refresh_slots).
        self._refresh_lock = threading.Lock()
        self._refreshes = 0

    def new_waiter_id(self) -> str:
        """A waiter id unique among this client's listeners (see ReleaseListener.new_waiter_id)."""
        return f"{self._id}:{next(self._sequence)}"

    @contextmanager
    def listen(self, channel_name: str, waiter_id: str = "") -> Iterator[ShardedSubscription]:
        """SSUBSCRIBE to ``channel_name`` on the node owning its slot, for the block.

        The subscription follows the slot when it moves (see :class:`ShardedSubscription`).
        ``waiter_id``: one from :meth:`new_waiter_id`; default a new one (kept across moves).
        """
        subscription = ShardedSubscription(self, channel_name, waiter_id or self.new_waiter_id())
        try:
            yield subscription
        finally:
            subscription._stack.close()

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

    def _owner_after_move(self, channel_name: str, left: ClusterNode) -> ClusterNode:
        """The primary serving ``channel_name``'s slot now, after node ``left`` dropped it.

        Asked of ``left`` itself: it dropped the subscription because it learnt
        where the slot went, while the client's map, or another node, may not
        know yet. A replica would take the SSUBSCRIBE and never hear the
        primary's SPUBLISH, so a stale answer must not be used. When ``left``
        cannot tell, the map is read anew (:meth:`_refresh_slots`).
        """
        slot = slot_of(channel_name)
        owner = self._primary_seen_by(left, slot)
        if owner is None or owner.name == left.name:
            self._refresh_slots(self._refreshes)
            owner = self._cluster.nodes_manager.get_node_from_slot(slot)
        return owner

    def _primary_seen_by(self, node: ClusterNode, slot: int) -> ClusterNode | None:
        """The primary serving ``slot`` in ``node``'s own view (None: it cannot tell)."""
        try:
            node_client = self._cluster.get_redis_connection(node)
            ranges = node_client.execute_command("CLUSTER", "SLOTS")  # type: ignore[no-untyped-call, unused-ignore]
            address = next(
                (primary[0], int(primary[1]))
                for start, end, primary, *_replicas in ranges
                if int(start) <= slot <= int(end)
            )
        except Exception as error:  # noqa: BLE001 -- any failure, or no owner: the client's map
            logger.debug("cannot ask %s where slot %d is: %s", node.name, slot, error)
            return None
        host = address[0].decode() if isinstance(address[0], bytes) else str(address[0])
        if not host:  # the node does not know its own address
            return None
        manager = self._cluster.nodes_manager
        host, port = manager.remap_host_port(host, address[1])
        found = manager.get_node(host=host, port=port)
        if found is None:  # a node the client has not met: read the whole map
            self._refresh_slots(self._refreshes)
            found = manager.get_node(host=host, port=port)
        return found

    def _refresh_slots(self, seen: int) -> None:
        """Read the slot map anew, unless it was read since the caller saw refresh ``seen``.

        Waiters moving at once share one refresh. A refresh that fails leaves
        the map as it was: the waiter subscribes where that says, and a
        refusal tells it again.
        """
        with self._refresh_lock:
            if self._refreshes != seen:
                return
            try:
                self._cluster.nodes_manager.initialize()
            except Exception as error:  # noqa: BLE001 -- any failure: the old map; waits stay bounded
                logger.debug("cluster slot map refresh failed: %s", error)
            self._refreshes += 1

    def _node_for(self, channel_name: str) -> ClusterNode:
        """The node owning ``channel_name``'s slot in the client's map."""
        return self._cluster.nodes_manager.get_node_from_slot(slot_of(channel_name))

    def _listener_on(self, node: ClusterNode) -> ReleaseListener:
        with self._lock:
            if self._closed:
                raise RuntimeError("the lock client is closed")
            listener = self._listeners.get(node.name)
            if listener is None:
                node_client = self._cluster.get_redis_connection(node)
                listener = ReleaseListener(node_client, sharded=True, hand_over=False)
                self._listeners[node.name] = listener
            return listener


class ShardedSubscription:
    """A waiter's subscription on the node owning its channel's slot, following the slot.

    It answers as a :class:`~django_rlock.core._sync.waiting.Subscription` of
    the node's listener does. When that node drops or refuses the subscription
    (the slot moved: a reshard, a failover), the waiter is woken; its next
    :meth:`wait_subscribed` asks that node where the slot went and subscribes
    on the slot's owner under the same waiter id, and :meth:`wait` returns at
    once meanwhile. The waiter's plan retries the acquire only once the new
    subscription is confirmed, so a release made while it was subscribed
    nowhere is found by that retry, and none after it is missed.
    """

    def __init__(self, listener: ShardedReleaseListener, channel_name: str, waiter_id: str) -> None:
        self.waiter_id = waiter_id
        self._listener, self._channel_name = listener, channel_name
        self._stack = ExitStack()
        self._node = listener._node_for(channel_name)
        self._inner = self._subscribe(listener._listener_on(self._node))

    @property
    def handoff(self) -> bytes:
        """The node subscription's last handoff message (see :class:`Subscription`)."""
        return self._inner.handoff

    @handoff.setter
    def handoff(self, grant: bytes) -> None:
        self._inner.handoff = grant

    def mark(self) -> int:
        """The waiter's wake-up count now (see :meth:`Subscription.mark`)."""
        return self._inner.mark()

    def wait_subscribed(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the slot's owner to confirm the subscription.

        A subscription the node dropped or refused is made again on the slot's
        owner (:meth:`ShardedReleaseListener._owner_after_move`); should that
        still be refused (an owner named before every node knew of the move),
        again after a growing pause, until the timeout.
        """
        deadline = clock.monotonic() + timeout
        pause, moves = _FIRST_PAUSE, 0
        while True:  # bounded: a round that moves again pauses first; all end by the deadline
            if self._inner.gone:
                left = deadline - clock.monotonic()
                if left <= 0:
                    return False
                if moves:
                    time.sleep(min(pause, left))
                    pause = min(pause * 2, _LONGEST_PAUSE)
                if not self._move():
                    return False
                moves += 1
            if not self._inner.wait_subscribed(max(deadline - clock.monotonic(), 0.0)):
                return False
            if not self._inner.gone:
                return True

    def wait(self, since: int, timeout: float) -> bool:
        """As :meth:`Subscription.wait`; at once while the subscription is gone (move it first)."""
        if self._inner.gone and not self._listener._closed:
            return True
        return self._inner.wait(since, timeout)

    def _subscribe(self, node_listener: ReleaseListener) -> Subscription:
        return self._stack.enter_context(node_listener.listen(self._channel_name, self.waiter_id))

    def _move(self) -> bool:
        """Subscribe on the slot's owner now (see _owner_after_move); False: cannot now."""
        listener = self._listener
        try:
            node = listener._owner_after_move(self._channel_name, self._node)
            node_listener = listener._listener_on(node)
        except (RuntimeError, *SLOT_MOVING) as error:  # closed, or the map has no owner now
            logger.debug("cannot subscribe %s again: %s", self._channel_name, error)
            return False
        logger.debug(
            "%s dropped or refused the subscription to %s: subscribing on %s",
            self._node.name,
            self._channel_name,
            node.name,
        )
        self._node = node
        handoff = self._inner.handoff
        self._stack.close()  # the node dropped it; the same waiter id is subscribed next
        self._stack = ExitStack()
        try:
            self._inner = self._subscribe(node_listener)
        except RuntimeError:  # the client closed meanwhile
            return False
        self._inner.handoff = self._inner.handoff or handoff
        return True
