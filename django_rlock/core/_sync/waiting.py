"""Waiting for a release without polling.

Each client has one :class:`ReleaseListener`: one pub/sub connection shared by
every thread that waits for a lock. A waiter subscribes to the lock's release
channels (the shared one and its listener's wake channel for the lock, in one
command) and has both subscriptions confirmed *before* it retries the acquire,
so a release between its failed attempt and its wait cannot be missed; it then
sleeps until a release wakes it or the holder's PTTL runs out, whichever is
first.

Wake-ups are targeted. A waiter that retries registers its waiter id in the
lock's waiting set, inside the acquire script, and a release names the one
waiter it wakes, on the wake channel that id names
(:mod:`~django_rlock.core._protocol.channels`): only that waiter's process
reads it. An empty message on the shared channel wakes every waiter of the
lock. A release therefore costs one process one wake-up, not one per waiting
process (no thundering herd). Waiter ids are random per listener: they are
not the owner credential.

There is no dispatcher thread. The waiting threads read the connection
themselves, one at a time (leader/follower): the first to wait becomes the
reader and hands each message to the waiter it names; when the reader is woken
or gives up, it passes the role to a waiting thread whose own wake-up has not
come yet. Every thread that stops waiting while nobody reads does the same, so
the role is never dropped while a waiter remains: a burst of releases (a
thread pool's waiters, each on its own lock, freed together) wakes every
waiter, not only the reader and those whose messages it read before it left.
The common case (one waiting thread per process) thus costs one thread wake-up
per release, and a process with no waiters runs no thread at all.

A waiter granted the lock leaves its channels subscribed a little while
(:meth:`~django_rlock.core._protocol.channels.ChannelTable.remove`'s ``linger``;
ended as a later wait ends, or at close): a lock contended in a loop is waited
for again at once, and that wait then finds its subscription confirmed.

The channels' state (reference counts, confirmations, whom a message wakes,
what a failed read means) is a :class:`~django_rlock.core._protocol.channels.ChannelTable`,
shared with the asyncio listener; this module moves its bytes. If the
connection dies, every waiter is woken to retry, and the next reader
reconnects and subscribes again; a message lost in between costs a waiter at
most the holder's PTTL, never a hang.
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import redis

from django_rlock.core._protocol import clock
from django_rlock.core._protocol.channels import (
    RECONNECT_BACKOFF,
    Channel,
    ChannelTable,
    ReadError,
    WakeCount,
    listen_channels,
    log_refusal,
    new_wake_name,
)
from django_rlock.core._protocol.names import LockKeys
from django_rlock.core._protocol.plan import AcquirePlan
from django_rlock.core._sync.connection import GET_CONNECTION_ARGS, derive_pool

logger = logging.getLogger("django_rlock.waiting")


@dataclass(eq=False)
class Subscription(WakeCount):
    """One waiter's handle on a release channel, valid inside :meth:`ReleaseListener.listen`."""

    waiter_id: str
    #: The lock's shared release channel, then this waiter's wake channel.
    _channels: tuple[bytes, ...] = field(repr=False)
    _listener: ReleaseListener = field(repr=False)
    _cond: threading.Condition = field(repr=False)
    #: Set by a waiter that leaves no entry in the lock's waiting set behind
    #: (granted, or never registered): its channels may stay subscribed a
    #: little while for the lock's next wait (ChannelTable.remove).
    linger: bool = field(default=False, repr=False)

    def mark(self) -> int:
        """The waiter's wake-up count now; pass it to :meth:`wait` after a failed attempt."""
        with self._cond:
            return self._wakeups

    @property
    def gone(self) -> bool:
        """Whether the server dropped or refused the subscription (on a cluster: its slot moved)."""
        with self._cond:
            return any(self._listener._table.gone(name) for name in self._channels)

    def wait_subscribed(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the server to answer the subscriptions."""
        listener, channels = self._listener, self._channels
        return listener._wait(self, lambda: listener._table.confirmed_all(channels), timeout)

    def wait(self, since: int, timeout: float) -> bool:
        """Sleep until this waiter is woken after ``since``, or ``timeout`` seconds pass.

        Returns True when woken (by a release or a reconnect), False on timeout.
        """
        return self._listener._wait(self, lambda: self._wakeups != since, timeout)

    def _signal(self) -> None:
        self._cond.notify()  # the table is called with the listener's lock held


class Waiting(Protocol):
    """What a waiter uses of its subscription.

    A :class:`Subscription`, or on a cluster a
    :class:`~django_rlock.core._sync.sharding.ShardedSubscription` that follows its slot.
    """

    waiter_id: str
    handoff: bytes

    def mark(self) -> int: ...

    def wait_subscribed(self, timeout: float) -> bool: ...

    def wait(self, since: int, timeout: float) -> bool: ...


class Listener(Protocol):
    """What waiting needs: a plain ReleaseListener or a per-node sharded one."""

    def listen(self, channel_name: str, waiter_id: str = "") -> AbstractContextManager[Waiting]: ...

    def new_waiter_id(self) -> str: ...

    def subscribed_channels(self) -> set[bytes]: ...

    @property
    def messages(self) -> int: ...

    def close(self) -> None: ...


def lingers(subscription: Waiting) -> None:
    """Its waiter leaves no entry in the lock's waiting set behind (granted, or never registered).

    Its channels may then stay subscribed a little while for the lock's next
    wait (:meth:`ChannelTable.remove`); a cluster's sharded subscription never does.
    """
    if isinstance(subscription, Subscription):
        subscription.linger = True


def subscribed_first(plan: AcquirePlan, listener: Listener, lock: HasChannel) -> bool:
    """Whether a caller of ``plan`` may skip the attempt that does not wait (plan.SUBSCRIBED).

    True when it will wait if the lock is held, and this process's channels
    for the lock are confirmed already: they linger from its last wait, so the
    lock was contended within the last second and is most likely held again;
    the attempt that does not wait would only find that out, one round trip
    before the registered one.
    """
    if not plan.blocking or plan.zero_wait or not isinstance(listener, ReleaseListener):
        return False
    return listener.subscribed_to(lock.keys.channel)


class HasChannel(Protocol):
    """A lock, as :func:`subscribed_first` reads it."""

    @property
    def keys(self) -> LockKeys: ...


#: What :func:`_read_within` returns when no reply came in time.
NOTHING_CAME = object()


def _read_within(connection: Any, timeout: float) -> Any:
    """The next reply on the pub/sub ``connection``, or :data:`NOTHING_CAME` after ``timeout`` s.

    One read with the socket's timeout set, not ``can_read(timeout)`` and then
    ``read_response()``: on the wake-up path (a release's message arrives, the
    waiter returns holding the lock) that pair costs two more polls and a
    peek of the socket. A reply already parsed into redis-py's buffer is
    returned without touching the socket, as ``can_read`` would have seen it;
    a partial reply stays buffered across a timeout (hiredis keeps what it was
    fed; the plain parser rewinds), and the connection is left as it is
    (``disconnect_on_error=False``): the caller decides what an error means.
    The socket keeps the timeout it is given: the listener's writes
    (:meth:`ReleaseListener._send_locked`) are small commands a socket takes
    at once, and the next read sets its own.
    """
    sock = connection._sock
    if sock is None:
        raise redis.ConnectionError("the pub/sub connection is closed")
    sock.settimeout(timeout)
    try:
        return connection.read_response(push_request=True, disconnect_on_error=False)
    except (redis.TimeoutError, TimeoutError):  # redis-py's, or the socket's own
        return NOTHING_CAME


class ReleaseListener:
    """One pub/sub connection per client, read in turn by the threads that wait."""

    def __init__(
        self, client: redis.Redis, *, sharded: bool = False, hand_over: bool = True
    ) -> None:
        self._pool = derive_pool(client, health_check_interval=0)
        # Sharded pub/sub (Redis Cluster >= 7): the node owning the channel's
        # slot is the only one that hears its SPUBLISH, so nothing is broadcast.
        self._wire = {"SUBSCRIBE": "SSUBSCRIBE", "UNSUBSCRIBE": "SUNSUBSCRIBE"} if sharded else {}
        self._lock = threading.Lock()
        self._table: ChannelTable[Subscription] = ChannelTable()
        # Threads asleep while another reads, each with what it waits for.
        self._followers: dict[Subscription, Callable[[], bool]] = {}
        self._reading = False
        self._connection: Any = None
        # The connection's socket, written to directly by subscribing threads
        # (see _send_locked); None whenever _connection is.
        self._socket: socket.socket | None = None
        self._connect_failures = 0
        self._closed = False
        # Its waiters are woken on their wake channel; hand_over=False: never
        # handed a lock (channels.py: where a publish's count cannot be trusted).
        self._id = new_wake_name(hand_over=hand_over)
        self._sequence = itertools.count()

    @property
    def connected(self) -> bool:
        """Whether the pub/sub connection is up."""
        return self._table.connected

    def subscribed_channels(self) -> set[bytes]:
        """Channels with a subscription in force (for tests and diagnostics)."""
        with self._lock:
            return self._table.subscribed()

    def subscribed_to(self, channel_name: str) -> bool:
        """Whether a waiter of ``channel_name`` would find its channels confirmed already."""
        if not self._table.channels:
            return False  # nothing subscribed (every uncontended process): no mutex, no names
        names = listen_channels(channel_name.encode("utf-8"), f"{self._id}:0")
        with self._lock:
            return self._table.confirmed_all(names)

    @property
    def messages(self) -> int:
        """Release messages this listener has read (for diagnostics and benchmarks)."""
        return self._table.messages

    def new_waiter_id(self) -> str:
        """A waiter id unique to this listener, for a waiter that must name itself early.

        A fair lock's waiter takes its place in the queue under this id before
        it subscribes, then subscribes with it (``listen(..., waiter_id=...)``).
        """
        return f"{self._id}:{next(self._sequence)}"

    @contextmanager
    def listen(self, channel_name: str, waiter_id: str = "") -> Iterator[Subscription]:
        """Subscribe to ``channel_name`` and the waiter's wake channel for the block.

        ``waiter_id``: one from :meth:`new_waiter_id`; default a new one.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("the lock client is closed")
            waiter_id = waiter_id or self.new_waiter_id()
            names = listen_channels(channel_name.encode("utf-8"), waiter_id)
            subscription = Subscription(waiter_id, names, self, threading.Condition(self._lock))
            to_subscribe = self._table.add_all(names, subscription)
            if to_subscribe:
                self._send_locked(to_subscribe, "SUBSCRIBE")
        try:
            yield subscription
        finally:
            with self._lock:
                now = clock.monotonic()
                to_unsubscribe = self._table.remove_all(
                    names, subscription, linger=now if subscription.linger else None
                )
                if to_unsubscribe:
                    self._send_locked(to_unsubscribe, "UNSUBSCRIBE")
                for channel in self._table.expired(now):
                    self._send_locked([channel], "UNSUBSCRIBE")

    def close(self) -> None:
        """Close the connection. Threads still waiting fall back to their PTTL waits."""
        with self._lock:
            self._closed = True
            connection, self._connection, self._socket = self._connection, None, None
            self._table.on_disconnect()
        if connection is not None:
            self._give_back(connection)
        self._pool.disconnect()

    # -- waiting: the leader/follower protocol ---------------------------------------

    def _wait(self, subscription: Subscription, ready: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``ready()`` (checked under the lock) or ``timeout`` seconds pass.

        The calling thread reads the connection itself when no other thread is
        reading; otherwise it sleeps until the reader wakes it or hands it the role.
        """
        deadline = clock.monotonic() + timeout
        try:
            while True:
                with self._lock:
                    if ready():
                        return True
                    remaining = deadline - clock.monotonic()
                    if remaining <= 0:
                        return False
                    if self._reading or self._closed:
                        self._followers[subscription] = ready
                        try:
                            subscription._cond.wait(remaining)
                        finally:
                            self._followers.pop(subscription, None)
                        continue
                    self._reading = True
                try:
                    self._read_until(ready, deadline)
                finally:
                    with self._lock:
                        self._reading = False
                # This thread looks at ready() again: it reads on, or leaves below.
        finally:
            with self._lock:
                self._pass_on_locked()

    def _read_until(self, ready: Callable[[], bool], deadline: float) -> None:
        """As the reader: dispatch messages until ``ready()`` or the deadline."""
        while True:
            remaining = deadline - clock.monotonic()
            if remaining <= 0 or self._closed:
                return
            connection = self._connection
            if connection is None:
                if not self._connect():
                    # Back off between attempts; the waiter's own deadline still rules.
                    step = min(self._connect_failures, len(RECONNECT_BACKOFF)) - 1
                    time.sleep(min(RECONNECT_BACKOFF[step], remaining))
                    continue
                connection = self._connection
            try:
                reply = _read_within(connection, remaining)
                if reply is not NOTHING_CAME:
                    self._dispatch(reply)
            except Exception as error:  # noqa: BLE001 -- the table says what it means
                with self._lock:
                    verdict = self._table.read_error(error)
                if verdict is ReadError.BROKEN:
                    if not self._closed:
                        logger.warning("pub/sub connection lost, waiters will retry: %s", error)
                    self._reset(connection)
                else:
                    log_refusal(verdict, error)
            with self._lock:
                if ready():
                    return

    # -- called with self._lock held -------------------------------------------------

    def _pass_on_locked(self) -> None:
        """A thread stops waiting: if nobody reads, wake a follower still waiting to read.

        Only a follower whose own wake-up has not come: one already woken
        returns without reading. Handing the role to any follower (often the
        one the leaving reader had just woken) left every other follower's
        message unread until its sleep ran out. A follower woken here reads,
        or, should its wait have ended meanwhile, passes the role on in turn.
        """
        if self._reading or self._closed:
            return
        for follower, follower_ready in self._followers.items():
            if not follower_ready():
                follower._cond.notify()
                return

    def _send_locked(self, channels: list[Channel[Subscription]], command: str) -> None:
        """Send ``command`` for ``channels`` (of one lock, so of one slot) in one write."""
        # Straight onto the socket, never through redis-py's send_command: the
        # reader may be inside a read that fails at this moment, and redis-py
        # then drops the socket without our lock; send_command would see no
        # socket and reconnect on the spot, reading the handshake reply while
        # holding our lock, a reply the reader thread can take first. That was
        # a deadlock (every waiter stuck, found on redis-py 5.2 under pub/sub
        # kills). A write to a socket the reader has closed just fails here.
        if self._socket is None:
            return  # the reader subscribes every wanted channel when it connects
        names = [channel.name for channel in channels]
        packed = self._connection.pack_command(self._wire.get(command, command), *names)
        try:
            self._socket.sendall(b"".join(packed))
        except OSError:
            # The reader sees the broken connection on its next read and resets.
            return
        if command == "SUBSCRIBE":
            for channel in channels:
                self._table.subscribe_sent(channel)

    # -- the connection, managed by whichever thread is reading -----------------------

    def _connect(self) -> bool:
        # Through the pool's get/release, never make_connection(): a connection
        # made outside get_connection() keeps its slot in the pool's count
        # forever, so every reconnect would leak one until the pool refuses
        # ("Too many connections") and the error escapes the waiters' acquire.
        try:
            # Any: redis-py's Connection is untyped.
            connection: Any = self._pool.get_connection(*GET_CONNECTION_ARGS)
        except Exception as error:  # noqa: BLE001 -- any failure: back off; waits stay bounded
            # get_connection() gave the connection back itself.
            self._connect_failures += 1
            logger.debug("pub/sub connect failed: %s", error)
            return False
        with self._lock:
            if self._closed:
                self._give_back(connection)
                return False
            self._connect_failures = 0
            self._connection = connection
            self._socket = connection._sock
            for channel in self._table.on_connect():
                # One command per channel: on a cluster, channels of other locks
                # may be in other slots, which one SSUBSCRIBE refuses.
                self._send_locked([channel], "SUBSCRIBE")
        return True

    def _reset(self, broken: Any) -> None:
        with self._lock:
            if self._connection is broken:
                self._connection, self._socket = None, None
                self._table.on_disconnect()
        self._give_back(broken)

    def _give_back(self, connection: Any) -> None:
        """Close ``connection`` and return its slot to the pool (it is reused, not leaked)."""
        connection.disconnect()
        self._pool.release(connection)

    def _dispatch(self, reply: Any) -> None:
        with self._lock:
            self._table.deliver(reply)
