"""Waiting for a release in asyncio: the twin of :mod:`django_rlock.core.waiting`.

One pub/sub connection per client, read by one reader task that runs only
while someone waits. A waiter registers its subscription synchronously (no
await, so cancellation can never leave it half-registered), has the server
confirm the subscription before it retries, and is woken by the release that
names it, by an empty (wake-everyone) release message, or by a reconnect.
Subscribe and unsubscribe commands are sent by tasks of the listener's own, so
a waiter cancelled mid-wait still leaves no channel subscribed behind it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio

from django_rlock.core.aio.connection import derive_async_pool

__all__ = ["AsyncReleaseListener", "AsyncSubscription"]

logger = logging.getLogger("django_rlock.waiting")

_RECONNECT_BACKOFF = (0.05, 0.1, 0.2, 0.5, 1.0)


@dataclass(eq=False)
class _Channel:
    name: bytes
    subscriptions: dict[bytes, AsyncSubscription] = field(default_factory=dict)
    wanted: bool = False
    sent: int = 0
    acked: int = 0
    confirmed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def settled(self) -> bool:
        return self.acked >= self.sent


@dataclass(eq=False)
class AsyncSubscription:
    """One waiting task's handle on a release channel."""

    waiter_id: str
    _channel: _Channel = field(repr=False)
    _event: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _wakeups: int = 0

    def mark(self) -> int:
        """The waiter's wake-up count now; pass it to :meth:`wait` after a failed attempt."""
        return self._wakeups

    async def wait_subscribed(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the server to confirm the subscription."""
        try:
            async with asyncio.timeout(timeout):
                await self._channel.confirmed.wait()
        except TimeoutError:
            return False
        return True

    async def wait(self, since: int, timeout: float) -> bool:
        """Sleep until woken after ``since`` or ``timeout`` seconds pass; True when woken."""
        try:
            async with asyncio.timeout(timeout):
                while self._wakeups == since:
                    # Single-threaded: nothing can wake us between clear() and wait().
                    self._event.clear()
                    await self._event.wait()
        except TimeoutError:
            return False
        return True

    def _wake(self) -> None:
        self._wakeups += 1
        self._event.set()


class AsyncReleaseListener:
    """One pub/sub connection per async client, read by a task while anyone waits."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self._pool = derive_async_pool(client, health_check_interval=0, socket_timeout=None)
        self._channels: dict[bytes, _Channel] = {}
        self._waiters: dict[bytes, AsyncSubscription] = {}
        self._connection: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._id = secrets.token_hex(8)
        self._sequence = itertools.count()

    def subscribed_channels(self) -> set[bytes]:
        """Channels with a subscription in force (for tests and diagnostics)."""
        return {name for name, channel in self._channels.items() if channel.wanted}

    def subscribe(self, channel_name: str) -> AsyncSubscription:
        """Register a waiter on ``channel_name`` (no await: cancellation-proof)."""
        if self._closed:
            raise RuntimeError("the lock client is closed")
        name = channel_name.encode("utf-8")
        channel = self._channels.get(name)
        if channel is None:
            channel = self._channels[name] = _Channel(name)
        subscription = AsyncSubscription(f"{self._id}:{next(self._sequence)}", channel)
        key = subscription.waiter_id.encode()
        channel.subscriptions[key] = subscription
        self._waiters[key] = subscription
        if not channel.wanted:
            channel.wanted = True
            self._send(channel, "SUBSCRIBE")
        if self._reader is None or self._reader.done():
            self._reader = asyncio.ensure_future(self._read_loop())
        return subscription

    def unsubscribe(self, subscription: AsyncSubscription) -> None:
        """Remove a waiter (no await: safe in a ``finally`` under cancellation)."""
        channel = subscription._channel
        key = subscription.waiter_id.encode()
        channel.subscriptions.pop(key, None)
        self._waiters.pop(key, None)
        if not channel.subscriptions and channel.wanted:
            channel.wanted = False
            self._send(channel, "UNSUBSCRIBE")
            self._drop_if_idle(channel)

    async def aclose(self) -> None:
        """Stop reading and close the connection; pending waiters fall back to PTTL waits."""
        self._closed = True
        for subscription in self._waiters.values():
            subscription._wake()
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._connection is not None:
            await self._connection.disconnect()
            self._connection = None
        await self._pool.disconnect()

    async def settle(self) -> None:
        """Wait for every subscribe/unsubscribe command sent so far (tests, shutdown)."""
        # Only the unfinished: a finished task leaves the set by a done callback,
        # and since Python 3.12 gathering only finished tasks completes without
        # yielding to the loop, so that callback would never run (a busy loop).
        while pending := [task for task in self._tasks if not task.done()]:
            await asyncio.gather(*pending, return_exceptions=True)

    # -- commands and the reader task -----------------------------------------------

    def _send(self, channel: _Channel, command: str) -> None:
        if self._connection is None:
            return  # the reader subscribes every wanted channel when it connects
        if command == "SUBSCRIBE":
            channel.sent += 1
            channel.confirmed.clear()
        self._spawn(self._send_now(self._connection, command, channel.name))

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_now(self, connection: Any, command: str, name: bytes) -> None:
        try:
            await connection.send_command(command, name, check_health=False)
        except (redis.RedisError, OSError) as error:
            # The reader sees the broken connection on its next read and resets.
            logger.debug("pub/sub %s failed: %s", command, error)

    def _drop_if_idle(self, channel: _Channel) -> None:
        if not channel.subscriptions and channel.settled:
            self._channels.pop(channel.name, None)

    async def _read_loop(self) -> None:
        failures = 0
        while self._channels and not self._closed:
            if self._connection is None:
                if await self._connect():
                    failures = 0
                else:
                    await asyncio.sleep(_RECONNECT_BACKOFF[min(failures, 4)])
                    failures += 1
                continue
            connection = self._connection
            try:
                reply = await connection.read_response(push_request=True)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # noqa: BLE001 -- any broken read means reconnect
                logger.warning("pub/sub connection lost, waiters will retry: %s", error)
                self._reset(connection)
                await connection.disconnect()
                continue
            self._dispatch(reply)

    async def _connect(self) -> bool:
        # redis-py's Connection is untyped.
        connection: Any = self._pool.make_connection()  # type: ignore[no-untyped-call]
        try:
            await connection.connect()
        except (redis.RedisError, OSError) as error:
            logger.debug("pub/sub connect failed: %s", error)
            await connection.disconnect()
            return False
        self._connection = connection
        for channel in list(self._channels.values()):
            channel.sent = channel.acked = 0
            if channel.wanted:
                self._send(channel, "SUBSCRIBE")
            else:
                self._drop_if_idle(channel)
        # Anything published while we were away is gone: everyone retries.
        for subscription in self._waiters.values():
            subscription._wake()
        return True

    def _reset(self, broken: Any) -> None:
        if self._connection is broken:
            self._connection = None
            for channel in self._channels.values():
                channel.confirmed.clear()
            for subscription in self._waiters.values():
                subscription._wake()

    def _dispatch(self, reply: Any) -> None:
        if not isinstance(reply, list) or len(reply) < 3:
            return
        kind, name, payload = reply[0], reply[1], reply[2]
        if kind in (b"message", b"smessage"):
            if payload:
                target = self._waiters.get(payload)
                if target is not None:
                    target._wake()
                return
            channel = self._channels.get(name)
            if channel is not None:
                for subscription in channel.subscriptions.values():
                    subscription._wake()
        elif kind in (b"subscribe", b"ssubscribe"):
            channel = self._channels.get(name)
            if channel is not None:
                channel.acked += 1
                if channel.settled and self._connection is not None:
                    channel.confirmed.set()
                self._drop_if_idle(channel)
