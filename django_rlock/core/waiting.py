"""Waiting for a release without polling.

Each client has one :class:`ReleaseListener`: one pub/sub connection shared by
every waiting thread, read by one dispatcher thread. A waiter subscribes to the
lock's release channel *before* it retries the acquire, so a release between
its failed attempt and its wait cannot be missed; it then sleeps until a
release message arrives or the holder's PTTL runs out, whichever is first.

Channels are reference-counted: the first waiter on a lock subscribes, the last
one to leave unsubscribes. If the connection dies, every waiter is woken at
once to retry, and the dispatcher reconnects and subscribes again; a message
lost in between costs a waiter at most the holder's PTTL, never a hang.

Subscriptions are confirmed by counting: ``sent`` SUBSCRIBE commands against
``acked`` confirmations per channel. A channel's state outlives its waiters
until every confirmation has arrived, so a late confirmation of an old
subscription can never pass for a new one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import redis

from django_rlock.core.connection import derive_pool

__all__ = ["ReleaseListener", "Subscription"]

logger = logging.getLogger("django_rlock.waiting")

# How long the dispatcher blocks on an idle connection before it looks at its
# own shutdown flag again; close() also wakes it by disconnecting the socket.
_IDLE_READ_SECONDS = 5.0
_RECONNECT_BACKOFF = (0.05, 0.1, 0.2, 0.5, 1.0)


@dataclass(eq=False)
class _Channel:
    name: bytes
    cond: threading.Condition
    waiters: int = 0
    wanted: bool = False  # a SUBSCRIBE is in force (sent and not unsubscribed)
    sent: int = 0
    acked: int = 0
    generation: int = 0  # bumped by each release message and each reconnect

    @property
    def settled(self) -> bool:
        return self.acked >= self.sent


@dataclass(eq=False)
class Subscription:
    """A waiter's handle on a release channel, valid inside :meth:`ReleaseListener.listen`."""

    _channel: _Channel
    _listener: ReleaseListener = field(repr=False)

    def mark(self) -> int:
        """The channel's generation now; pass it to :meth:`wait` after a failed attempt."""
        with self._channel.cond:
            return self._channel.generation

    def wait_subscribed(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the server to confirm the subscription."""
        channel = self._channel
        with channel.cond:
            return channel.cond.wait_for(
                lambda: channel.settled and self._listener.connected, timeout
            )

    def wait(self, since: int, timeout: float) -> bool:
        """Sleep until a release (or reconnect) after ``since``, or ``timeout`` seconds.

        Returns True when woken by an event, False on timeout.
        """
        channel = self._channel
        with channel.cond:
            return channel.cond.wait_for(lambda: channel.generation != since, timeout)


class ReleaseListener:
    """One pub/sub connection and dispatcher thread per client, shared by all waiters."""

    def __init__(self, client: redis.Redis) -> None:
        self._pool = derive_pool(client, health_check_interval=0)
        self._lock = threading.Lock()
        self._channels: dict[bytes, _Channel] = {}
        self._connection: Any = None
        self.connected = False
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()

    @property
    def thread(self) -> threading.Thread | None:
        """The dispatcher thread, once a waiter has started it."""
        return self._thread

    def subscribed_channels(self) -> set[bytes]:
        """Channels with a subscription in force (for tests and diagnostics)."""
        with self._lock:
            return {name for name, channel in self._channels.items() if channel.wanted}

    @contextmanager
    def listen(self, channel_name: str) -> Iterator[Subscription]:
        """Subscribe to ``channel_name`` for the duration of the block."""
        name = channel_name.encode("utf-8")
        with self._lock:
            if self._closed.is_set():
                raise RuntimeError("the lock client is closed")
            channel = self._channels.get(name)
            if channel is None:
                channel = _Channel(name, threading.Condition(self._lock))
                self._channels[name] = channel
            channel.waiters += 1
            if not channel.wanted:
                channel.wanted = True
                self._send_locked(channel, "SUBSCRIBE")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rlock-pubsub", daemon=True)
                self._thread.start()
        try:
            yield Subscription(channel, self)
        finally:
            with self._lock:
                channel.waiters -= 1
                if channel.waiters == 0:
                    channel.wanted = False
                    self._send_locked(channel, "UNSUBSCRIBE")
                    self._drop_if_idle(channel)

    def close(self) -> None:
        """Stop the dispatcher and close the connection. Waiters fall back to PTTL waits."""
        self._closed.set()
        with self._lock:
            connection, self._connection = self._connection, None
            self.connected = False
            self._wake_all_locked()
        if connection is not None:
            connection.disconnect()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=_IDLE_READ_SECONDS + 1)
        self._pool.disconnect()

    # -- called with self._lock held -------------------------------------------------

    def _send_locked(self, channel: _Channel, command: str) -> None:
        if not self.connected:
            return  # the dispatcher subscribes every wanted channel when it connects
        try:
            self._connection.send_command(command, channel.name, check_health=False)
        except (redis.RedisError, OSError):
            # The dispatcher sees the broken connection on its next read and resets.
            return
        if command == "SUBSCRIBE":
            channel.sent += 1

    def _drop_if_idle(self, channel: _Channel) -> None:
        if channel.waiters == 0 and channel.settled:
            self._channels.pop(channel.name, None)

    def _wake_all_locked(self) -> None:
        for channel in self._channels.values():
            channel.generation += 1
            channel.cond.notify_all()

    # -- the dispatcher thread -------------------------------------------------------

    def _run(self) -> None:
        failures = 0
        while not self._closed.is_set():
            if self._connection is None:
                if not self._connect():
                    delay = _RECONNECT_BACKOFF[min(failures, len(_RECONNECT_BACKOFF) - 1)]
                    failures += 1
                    self._closed.wait(delay)
                continue
            failures = 0
            try:
                if self._connection.can_read(timeout=_IDLE_READ_SECONDS):
                    self._dispatch(self._connection.read_response(push_request=True))
            except Exception as error:  # noqa: BLE001 -- the dispatcher must outlive any error
                if self._closed.is_set():
                    break  # close() pulled the socket out from under the read
                logger.warning("pub/sub connection lost, waiters will retry: %s", error)
                self._reset()

    def _connect(self) -> bool:
        # redis-py's Connection is untyped; the dispatcher only sends and reads.
        connection: Any = self._pool.make_connection()
        try:
            connection.connect()
        except (redis.RedisError, OSError) as error:
            logger.debug("pub/sub connect failed: %s", error)
            connection.disconnect()
            return False
        with self._lock:
            if self._closed.is_set():
                connection.disconnect()
                return False
            self._connection = connection
            self.connected = True
            for channel in list(self._channels.values()):
                channel.sent = channel.acked = 0
                if channel.wanted:
                    self._send_locked(channel, "SUBSCRIBE")
                else:
                    self._drop_if_idle(channel)
            # Anything published while we were away is gone: everyone retries.
            self._wake_all_locked()
        return True

    def _reset(self) -> None:
        with self._lock:
            connection, self._connection = self._connection, None
            self.connected = False
            self._wake_all_locked()
        if connection is not None:
            connection.disconnect()

    def _dispatch(self, reply: Any) -> None:
        if not isinstance(reply, list) or len(reply) < 3:
            return
        kind, name = reply[0], reply[1]
        with self._lock:
            channel = self._channels.get(name)
            if channel is None:
                return
            if kind in (b"message", b"smessage"):
                channel.generation += 1
                channel.cond.notify_all()
            elif kind in (b"subscribe", b"ssubscribe"):
                channel.acked += 1
                channel.cond.notify_all()
                self._drop_if_idle(channel)
