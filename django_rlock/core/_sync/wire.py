"""The lean command path: acquire and release on the calling thread's held connection.

Each thread that takes locks through a :class:`~django_rlock.core.LockClient`
holds one connection of the caller's pool (``LockClient.held``), a
:class:`HeldClient`. Its script calls skip redis-py's command path (the
client's ``execute_command``, argument encoding, the pool, the response
callbacks), which costs more Python than the round trip itself: a call is
packed by :func:`django_rlock.core._protocol.resp.evalsha` (the repeated parts
encoded once) into one ``bytes``, written with the connection's own
``send_packed_command`` (one ``sendall``) and read with its own
``read_response`` (hiredis when installed).

Everything else stays redis-py's, on the same connection object: connecting
(AUTH/ACL, TLS, a Sentinel's master, the handshake), the socket and its
timeouts, health checks, the parser and its errors (``ConnectionError``,
``TimeoutError``, ``ResponseError`` and its subclasses, the same as through
the client), and the caller's retry policy (:meth:`HeldClient.run_script`
runs each call through the connection's ``Retry`` as the client does, the
connection dropped between attempts). What the lean path does not do is
left to redis-py's path: a NOSCRIPT reply (the script is loaded there and
run again, see ``_sync/scripts.py``), every other command, a cluster (no
held connection there), and the threads past the held limit.

Fork safety is the pool's: a forked child's threads hold no connection
(``LockClient`` renews its per-thread record after a fork) and take a new
one from the pool, which redis-py resets in a child.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis

from django_rlock.core._protocol import resp

#: redis-py before 6 retried only the errors a connection lists in
#: ``retry_on_error`` (whatever its Retry supports); 6 and later, what the
#: Retry supports. The lean path keeps the installed version's rule.
_LISTED_ERRORS_ONLY = redis.VERSION[0] < 6


class HeldClient(redis.Redis):
    """A client holding one connection of its pool for one thread; scripts go lean.

    Built as redis-py's ``single_connection_client``: the connection is taken
    from the pool (and connected) when the client is made, and given back by
    :meth:`close`.
    """

    def __init__(self, pool: redis.ConnectionPool) -> None:
        super().__init__(connection_pool=pool, single_connection_client=True)

    def __del__(self) -> None:
        # Run by the garbage collector when the client was left in a reference
        # cycle (redis-py 5 leaves one through a failed call's traceback): in
        # whatever thread it runs, possibly one inside this pool's lock, which
        # on redis-py 5 is a plain Lock: redis-py's own __del__ (close(), a
        # pool release) then deadlocked that thread, and every other thread
        # of the pool after it. The connection goes back to the pool only if
        # its lock is free at once; else it is closed where it is (the pool
        # counts it in use until the pool is disconnected).
        connection = getattr(self, "connection", None)
        if connection is None:
            return  # closed already, or never connected
        self.connection = None
        pool = self.connection_pool
        lock = getattr(pool, "_lock", None)
        if lock is None or not lock.acquire(blocking=False):
            connection.disconnect()
            return
        lock.release()
        pool.release(connection)

    def run_script(self, sha: str, keys: list[Any], args: list[Any]) -> Any:
        """``EVALSHA sha`` with ``keys`` and ``args``: the reply as redis-py parses it.

        Raises what the client's ``evalsha`` would: redis-py's errors, the
        script's error replies as ``ResponseError`` (``NoScriptError`` when
        the server does not have it), after the connection's retry policy.
        """
        return self.run_packed(resp.evalsha(sha, keys, args))

    def run_packed(self, packed: bytes) -> Any:
        """Send one packed command, return its reply (see :meth:`run_script`).

        The first send runs outside the retry policy: a call that answers (the
        common case) builds no closure and enters no retry loop. An error it
        raises is handed to the connection's ``Retry`` as the error of its
        first try (:func:`_replayed`), so a failed call is retried exactly as
        when every try runs inside ``call_with_retry``: the same failure count,
        the connection dropped in between, the same backoff, and an error the
        policy does not retry raised as it is.
        """
        connection: Any = self.connection  # Any: redis-py's Connection is untyped
        if connection is None:
            raise redis.ConnectionError("the lock client's held connection was given back")
        command = (packed,)
        first: Exception | None = None
        try:
            connection.send_packed_command(command)
            return connection.read_response()
        except Exception as error:  # noqa: BLE001 -- the retry policy decides, as it would have
            first = error

        def round_trip() -> Any:
            connection.send_packed_command(command)
            return connection.read_response()

        def failed(error: Exception) -> None:
            connection.disconnect()
            if _LISTED_ERRORS_ONLY and not isinstance(
                error, tuple(connection.retry_on_error or ())
            ):
                raise error

        try:
            return connection.retry.call_with_retry(_replayed(first, round_trip), failed)
        finally:
            # Not kept: an error raised from here holds this frame in its
            # traceback, and this frame holding the first error would make a
            # cycle through this client, freed only by the garbage collector,
            # whose __del__ can then run inside redis-py's pool lock in any
            # thread: on redis-py 5 (a plain Lock) a deadlock.
            first = None


def _replayed(error: Exception, then: Callable[[], Any]) -> Callable[[], Any]:
    """A ``do`` for ``Retry.call_with_retry`` whose first try raises ``error`` (already met).

    The retry loop then sees the failure of the try made outside it, as if
    that try had run inside: the failure is counted, the failure handler runs,
    and the loop retries with ``then`` or raises, as its policy says.
    """
    pending = [error]

    def do() -> Any:
        if pending:
            raise pending.pop()
        return then()

    return do
