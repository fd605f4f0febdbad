"""Waiting for a release in asyncio: the twin of :mod:`django_rlock.core._sync.waiting`.

One pub/sub connection per client, read by one reader task that runs only
while someone waits. A waiter registers its subscription synchronously (no
await, so cancellation can never leave it half-registered) on the lock's
shared channel and its own wake channel (one command), has the server confirm
both before it retries, and is woken by the release that names it (on its
wake channel, or on the shared one from an older version), by an empty
(wake-everyone) release message, or by a reconnect.
Subscribe and unsubscribe commands are sent by tasks of the listener's own, so
a waiter cancelled mid-wait still leaves no channel subscribed behind it.
The channels' state is the sync listener's
:class:`~django_rlock.core._protocol.channels.ChannelTable`; this module moves its bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio

from django_rlock.core._aio.connection import GET_CONNECTION_ARGS, derive_async_pool
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

logger = logging.getLogger("django_rlock.waiting")


@dataclass(eq=False)
class AsyncSubscription(WakeCount):
    """One waiting task's handle on a release channel."""

    waiter_id: str
    #: The lock's shared release channel, then this waiter's wake channel.
    _channels: tuple[bytes, ...] = field(repr=False)
    _table: ChannelTable[AsyncSubscription] = field(repr=False)
    _event: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def mark(self) -> int:
        """The waiter's wake-up count now; pass it to :meth:`wait` after a failed attempt."""
        return self._wakeups

    async def wait_subscribed(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the server to answer the subscriptions."""
        return await self._until(lambda: self._table.confirmed_all(self._channels), timeout)

    async def wait(self, since: int, timeout: float) -> bool:
        """Sleep until woken after ``since`` or ``timeout`` seconds pass; True when woken."""
        return await self._until(lambda: self._wakeups != since, timeout)

    async def _until(self, ready: Callable[[], bool], timeout: float) -> bool:
        try:
            async with asyncio.timeout(timeout):
                while not ready():
                    # Single-threaded: nothing can wake us between clear() and wait().
                    self._event.clear()
                    await self._event.wait()
        except TimeoutError:
            return False
        return True

    def _signal(self) -> None:
        self._event.set()


class AsyncReleaseListener:
    """One pub/sub connection per async client, read by a task while anyone waits."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self._pool = derive_async_pool(client, health_check_interval=0, socket_timeout=None)
        self._table: ChannelTable[AsyncSubscription] = ChannelTable()
        self._connection: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._id = new_wake_name()
        self._sequence = itertools.count()

    def subscribed_channels(self) -> set[bytes]:
        """Channels with a subscription in force (for tests and diagnostics)."""
        return self._table.subscribed()

    @property
    def messages(self) -> int:
        """Release messages this listener has read (for diagnostics and benchmarks)."""
        return self._table.messages

    def new_waiter_id(self) -> str:
        """A waiter id unique to this listener (see ``ReleaseListener.new_waiter_id``)."""
        return f"{self._id}:{next(self._sequence)}"

    def subscribe(self, channel_name: str, waiter_id: str = "") -> AsyncSubscription:
        """Register a waiter on ``channel_name`` (no await: cancellation-proof).

        ``waiter_id``: one from :meth:`new_waiter_id`; default a new one.
        """
        if self._closed:
            raise RuntimeError("the lock client is closed")
        waiter_id = waiter_id or self.new_waiter_id()
        names = listen_channels(channel_name.encode("utf-8"), waiter_id)
        subscription = AsyncSubscription(waiter_id, names, self._table)
        to_subscribe = self._table.add_all(names, subscription)
        if to_subscribe:
            self._send(to_subscribe, "SUBSCRIBE")
        if self._reader is None or self._reader.done():
            self._reader = asyncio.ensure_future(self._read_loop())
        return subscription

    def unsubscribe(self, subscription: AsyncSubscription) -> None:
        """Remove a waiter (no await: safe in a ``finally`` under cancellation)."""
        to_unsubscribe = self._table.remove_all(subscription._channels, subscription)
        if to_unsubscribe:
            self._send(to_unsubscribe, "UNSUBSCRIBE")

    async def aclose(self) -> None:
        """Stop reading and close the connection; pending waiters fall back to PTTL waits."""
        self._closed = True
        self._table.wake_all()
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._connection is not None:
            await self._give_back(self._connection)
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

    def _send(self, channels: list[Channel[AsyncSubscription]], command: str) -> None:
        """Send ``command`` for ``channels`` (of one lock) in one command."""
        if self._connection is None:
            return  # the reader subscribes every wanted channel when it connects
        if command == "SUBSCRIBE":
            for channel in channels:
                self._table.subscribe_sent(channel)
        names = [channel.name for channel in channels]
        self._spawn(self._send_now(self._connection, command, names))

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_now(self, connection: Any, command: str, names: list[bytes]) -> None:
        # Only on the connection still in use, and only while it is up: redis-py's
        # send_command reconnects a dropped connection on the spot, which would
        # revive one the reader has already given back. Nothing is awaited
        # between this check and send_command's own, so it cannot go stale.
        if connection is not self._connection or not connection.is_connected:
            return  # the reader subscribes every wanted channel when it reconnects
        try:
            await connection.send_command(command, *names, check_health=False)
        except (redis.RedisError, OSError) as error:
            # The reader sees the broken connection on its next read and resets.
            logger.debug("pub/sub %s failed: %s", command, error)

    async def _read_loop(self) -> None:
        failures = 0
        while self._table.channels and not self._closed:
            if self._connection is None:
                if await self._connect():
                    failures = 0
                else:
                    step = min(failures, len(RECONNECT_BACKOFF) - 1)
                    await asyncio.sleep(RECONNECT_BACKOFF[step])
                    failures += 1
                continue
            connection = self._connection
            try:
                reply = await connection.read_response(push_request=True)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # noqa: BLE001 -- the table says what it means
                verdict = self._table.read_error(error)
                if verdict is not ReadError.BROKEN:
                    log_refusal(verdict, error)
                    continue
                logger.warning("pub/sub connection lost, waiters will retry: %s", error)
                self._reset(connection)
                await self._give_back(connection)
                continue
            self._table.deliver(reply)

    async def _connect(self) -> bool:
        # Through the pool's get/release, as the sync listener does: every
        # connection is counted by the pool and its slot comes back with it.
        try:
            connection: Any = await self._pool.get_connection(*GET_CONNECTION_ARGS)  # type: ignore[no-untyped-call]  # redis-py's is untyped
        except Exception as error:  # noqa: BLE001 -- any failure: back off; waits stay bounded
            # get_connection() gave the connection back itself.
            logger.debug("pub/sub connect failed: %s", error)
            return False
        self._connection = connection
        for channel in self._table.on_connect():
            self._send([channel], "SUBSCRIBE")
        return True

    async def _give_back(self, connection: Any) -> None:
        """Close ``connection`` and return its slot to the pool (it is reused, not leaked)."""
        await connection.disconnect()
        with contextlib.suppress(KeyError):  # already given back (redis-py raises KeyError)
            await self._pool.release(connection)

    def _reset(self, broken: Any) -> None:
        if self._connection is broken:
            self._connection = None
            self._table.on_disconnect()
