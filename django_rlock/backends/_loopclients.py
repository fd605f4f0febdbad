"""One asyncio lock client per event loop, closed when its loop shuts down.

An asyncio Redis client belongs to the loop it was made on, so a backend keeps
one per loop. Loops come and go: under WSGI, ``async_to_sync`` (what Django
runs an async view with) makes a loop per request and closes it afterwards.
A client left behind would keep its connections, file descriptors and
watchdog schedule for ever, one more per request.

So each client gets a guard task on its loop. ``asyncio.run`` (and so
``async_to_sync``) cancels every task left when its main coroutine ends, while
the loop still runs: the guard then waits for the other cancelled tasks (a
lock being released on the way out still has its client) and closes the
client. A loop closed without cancelling its tasks (``loop.close()`` by hand)
is noticed at the next lookup from any loop: its client stops renewing and its
sync connections are closed; its asyncio sockets go with the loop's objects.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from django_rlock.core._faces import forking
from django_rlock.core.aio import AsyncLockClient

logger = logging.getLogger("django_rlock")

# Every guard task of every registry, held strongly: asyncio keeps only weak
# references to tasks, and a guard waiting on a future nobody else holds would
# be garbage-collected mid-wait. A guard also waits for the other tasks of its
# loop, never for another guard (two guards waiting on each other would hang).
_guards: set[asyncio.Task[None]] = set()


class LoopClients:
    """The asyncio lock clients of one backend, one per running event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        forking.renew_after_fork(self, "_lock")
        self._clients: dict[asyncio.AbstractEventLoop, AsyncLockClient] = {}

    def __len__(self) -> int:
        return len(self._clients)

    def get(self, build: Callable[[], AsyncLockClient]) -> AsyncLockClient:
        """The running loop's client; ``build()`` makes it on the loop's first call."""
        loop = asyncio.get_running_loop()
        with self._lock:
            client = self._clients.get(loop)
            closed = [item for item in self._clients.items() if item[0].is_closed()]
            for gone, _ in closed:
                del self._clients[gone]
        if closed:
            _drop_stranded_guards()
        for _, abandoned in closed:
            _close_without_loop(abandoned)
        if client is not None:
            return client
        client = build()
        with self._lock:
            self._clients[loop] = client
        guard = loop.create_task(self._close_with_loop(loop, client), name="rlock-loop-guard")
        _guards.add(guard)
        guard.add_done_callback(_guards.discard)
        return client

    def close_all(self) -> None:
        """Forget every client, stopping their renewals (their loops may be gone)."""
        with self._lock:
            clients = list(self._clients.values())
            self._clients.clear()
        _drop_stranded_guards()
        for client in clients:
            _close_without_loop(client)

    async def _close_with_loop(
        self, loop: asyncio.AbstractEventLoop, client: AsyncLockClient
    ) -> None:
        try:
            await loop.create_future()  # never set: only the loop's shutdown ends this
        except asyncio.CancelledError:
            with self._lock:
                mine = self._clients.get(loop) is client
                if mine:
                    del self._clients[loop]
            if not mine:
                raise  # close_all() has closed it already
            current = asyncio.current_task()
            others = {task for task in asyncio.all_tasks() if task is not current}
            others -= set(_guards)
            if others:
                await asyncio.wait(others)
            try:
                await client.aclose()
                # The backend made this client's pool for it alone.
                await client.redis.connection_pool.disconnect()
            except Exception:  # the loop is shutting down: report, don't break it
                logger.exception("closing the asyncio lock client of a finished loop failed")
            raise


def _drop_stranded_guards() -> None:
    # Guards of loops closed without cancelling them (asyncio logs each one
    # as "destroyed but pending" when it goes: that loop was not shut down).
    for guard in list(_guards):  # list(): other loops' threads add and discard
        if guard.get_loop().is_closed():
            _guards.discard(guard)


def _close_without_loop(client: AsyncLockClient) -> None:
    # Its loop is closed (or not ours to run): stop renewing and close the
    # sync connections; the asyncio ones belong to the dead loop.
    client.engine.close()
    twin = client.engine.redis
    twin.close()
    twin.connection_pool.disconnect()
