"""The asyncio engine's lean command path: acquire and release on one pipelined connection.

Acquire and release are almost all an asyncio lock sends, and redis-py's
command path costs more than the scripts themselves (a pool checkout per call,
argument encoding, a parser behind a stream reader, one task wake-up per
layer). So each client keeps one connection of its own for those two calls:
a call is packed in one ``bytes`` (:func:`~django_rlock.core._protocol.resp.evalsha`)
and written at once, with no await before it; hiredis parses each reply as it
arrives, and the reply goes straight to the caller's future. Calls of many
tasks share the connection, pipelined: Redis answers in the order the calls
were written, so a queue of the calls on their way says whose reply is next.

What stays with redis-py:

* making the connection: redis-py's own connection class connects (TCP or
  unix socket, TLS, AUTH/ACL, HELLO, SELECT, client name), then its socket is
  taken over (:meth:`Wire._open`);
* a script the server does not know (NOSCRIPT: after a restart or SCRIPT
  FLUSH), loaded and run by redis-py's ``Script``, with its ``allow-oom``
  variant chosen there (:mod:`~django_rlock.core._sync.scripts`);
* a call whose connection broke before its reply is sent once more, with
  the same request id, the way ``resend_once`` does (the request latch makes
  a resend of a call Redis already ran a report, not a second run), on the
  next connection, made for it; when no connection can be made, the call
  goes through redis-py's path instead, under the caller's retry policy;
* every call of a client whose connections this cannot take over: a
  connection class of its own, an encoding other than UTF-8, RESP3 with a
  hiredis that cannot tell push messages from replies. Those run each call in
  a task of the client's (:meth:`Wire.send`), as the engine did before.

A reply that does not come within the connection's ``socket_timeout`` fails
its call with redis-py's ``TimeoutError`` (not resent: the call may have run)
and closes the connection, as redis-py does; the calls written after it fail
with it (a server that does not answer one O(1) script answers none), so no
call waits longer than the timeout for a stalled server.

Cancellation. A call is written before its caller first awaits, and its reply
is read by the connection, not by the caller: a caller cancelled while its
call is on the way leaves nothing half-done on the wire. Its :class:`Flight`
still lands (after its one resend, if its connection broke); whoever finishes
the call for the cancelled caller takes the outcome with :meth:`Flight.hand_over`,
and the caller's task sends its next call only after that (see ``AsyncRLock``
and ``AsyncLockClient.finish_for``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

import hiredis
import redis.asyncio
from redis._parsers import BaseParser
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from django_rlock.core._aio.connection import lean_connection
from django_rlock.core._process import forking
from django_rlock.core._protocol import resp
from django_rlock.core._protocol.calls import ScriptCall
from django_rlock.core._protocol.lock import LOST_REPLY
from django_rlock.core._protocol.refusals import permission_error

logger = logging.getLogger("django_rlock.lock")


#: hiredis's type for RESP3 push messages (hiredis >= 3.2), which are no replies.
_PUSH: type[Any] | None = getattr(hiredis, "PushNotification", None)


class WireScript(Protocol):
    """What the wire needs of a script: its SHA now, and redis-py's way to run it."""

    @property
    def sha(self) -> str:
        """The SHA1 of the body to send (an ``allow-oom`` script: of its current variant)."""
        ...

    async def __call__(self, keys: list[Any], args: list[Any]) -> Any:
        """Run the script through redis-py (EVALSHA, loading it on NOSCRIPT)."""
        ...


class Flight:
    """One script call on its way; its outcome lands whether or not its caller still waits.

    The caller awaits :attr:`waiter`. If the caller is cancelled meanwhile,
    the waiter is cancelled with it, but the call goes on: its outcome lands
    in the future :meth:`hand_over` returns.

    It is also the wire's record of the call (its script, what it sends,
    whether it was resent): one object per call, made once.
    """

    __slots__ = ("_heir", "_landed", "call", "packed", "resent", "script", "sent_at", "waiter")

    def __init__(
        self,
        waiter: asyncio.Future[Any],
        script: WireScript,
        call: ScriptCall,
        packed: bytes | None = None,
    ) -> None:
        #: The reply, or the call's error; what the caller awaits.
        self.waiter = waiter
        self.script = script
        self.call = call
        #: ``call`` already packed with the script's SHA (a lock's kept template),
        #: or None: packed when written. A NOSCRIPT refusal still goes by ``call``.
        self.packed = packed
        #: Sent before, on a connection that broke before the reply: not sent a third time.
        self.resent = False
        #: When it was written on its current connection (the event loop's clock).
        self.sent_at = 0.0
        self._heir: asyncio.Future[Any] | None = None
        self._landed: tuple[Any, BaseException | None] | None = None

    def land(self, reply: Any = None, error: BaseException | None = None) -> None:
        """The call's outcome: its reply, or ``error``."""
        waiter = self.waiter
        if not waiter.done():
            _resolve(waiter, reply, error)
        elif self._heir is not None:
            _resolve(self._heir, reply, error)
        else:  # the caller was cancelled and has not handed the call over yet
            self._landed = (reply, error)

    def hand_over(self) -> asyncio.Future[Any]:
        """For whoever finishes the call of a cancelled caller: a future of its outcome.

        Also when the outcome had landed already (in the waiter, as the
        cancellation came, or kept here).
        """
        waiter = self.waiter
        heir: asyncio.Future[Any] = waiter.get_loop().create_future()
        if waiter.done() and not waiter.cancelled():
            error = waiter.exception()
            _resolve(heir, None if error is not None else waiter.result(), error)
        elif self._landed is not None:
            _resolve(heir, *self._landed)
        else:
            self._heir = heir
        return heir


def _resolve(future: asyncio.Future[Any], reply: Any, error: BaseException | None) -> None:
    if future.done():
        return
    try:
        if error is None:
            future.set_result(reply)
        elif isinstance(error, asyncio.CancelledError):
            future.cancel()
        else:
            future.set_exception(error)
    except RuntimeError:  # its event loop is closed: nobody is left to tell
        pass


class Wire:
    """One client's lean connection for its lock calls (see the module's docstring).

    ``spawn`` runs a coroutine as a task the client keeps until it is done
    (``AsyncLockClient.spawn``): connecting, and the calls redis-py finishes.
    """

    def __init__(
        self,
        client: redis.asyncio.Redis,
        spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]],
    ) -> None:
        self._client = client
        self._spawn = spawn
        #: False once its connections are found not fit to take over (see
        #: ``lean_connection``): from then on every call goes through redis-py.
        self.lean = True
        self._protocol: _WireProtocol | None = None
        self._backlog: list[Flight] = []
        self._connecting = False
        self._closed = False
        # A forked child connects anew, and never touches its parent's socket
        # (closing its transport would unregister it from the parent's epoll).
        forking.renew_after_fork(self, "_protocol", lambda: None)
        forking.renew_after_fork(self, "_backlog", list)
        forking.renew_after_fork(self, "_connecting", bool)

    def send(self, script: Any, call: ScriptCall, packed: bytes | None = None) -> Flight:
        """Send ``call`` of ``script`` (a :class:`WireScript`) now, with no await.

        ``packed``: the same call already packed with ``script.sha`` (see
        :attr:`Flight.packed`); a NOSCRIPT refusal still goes by ``call``.
        """
        loop = asyncio.get_running_loop()
        flight = Flight(loop.create_future(), script, call, packed)
        protocol = self._protocol
        if protocol is not None and protocol.loop is loop and protocol.open:
            protocol.send(flight)
        else:
            self._send_later(loop, flight)
        return flight

    def close(self) -> None:
        """Close the connection; calls on their way still land (through redis-py)."""
        self._closed = True
        protocol, self._protocol = self._protocol, None
        if protocol is not None:
            protocol.close()

    # -- connecting -----------------------------------------------------------------

    def _send_later(self, loop: asyncio.AbstractEventLoop, call: Flight) -> None:
        if not self.lean or self._closed:
            self._through_redis_py_later(call, resend=True)
            return
        protocol = self._protocol
        if protocol is not None and protocol.loop is not loop:
            # The client is used from another event loop now: the old
            # connection belongs to the old loop, which may be closed.
            self._protocol = None
            protocol.abandon()
        self._backlog.append(call)
        if not self._connecting:
            self._connecting = True
            self._spawn(self._connect(loop)).add_done_callback(self._connect_ended)

    def _connect_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():  # before or while connecting: see _end_when_cancelled
            self._connecting = False
            backlog, self._backlog = self._backlog, []
            for call in backlog:
                call.land(error=_ended(call))

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> None:
        failed = False
        try:
            protocol: _WireProtocol | None = await self._open(loop)
        except Exception as error:  # noqa: BLE001 -- redis-py reports it: each call goes its way
            logger.debug("lock call connection failed: %s", error)
            protocol, failed = None, True
        finally:
            self._connecting = False
        backlog, self._backlog = self._backlog, []
        if protocol is None or self._closed:
            if protocol is not None:
                protocol.close()
            for call in backlog:
                # After a failed connect, redis-py's try (under the caller's
                # retry policy) is the call's second: not resent once more.
                resend = not (failed or call.resent)
                self._through_redis_py_later(call, resend=resend)
            return
        self._protocol = protocol
        for call in backlog:
            protocol.send(call)

    async def _open(self, loop: asyncio.AbstractEventLoop) -> _WireProtocol | None:
        """A connection made by redis-py, its socket taken over; None if it cannot be."""
        connection = lean_connection(self._client)
        if connection is None:
            self.lean = False
            return None
        if int(connection.protocol or 2) >= 3 and _PUSH is None:
            self.lean = False  # hiredis < 3.2 cannot tell a push message from a reply
            return None
        await connection.connect()
        try:
            # redis-py keeps the streams it connected privately, with no accessor.
            transport: Any = connection._writer.transport
            unread = len(connection._reader._buffer)
        except AttributeError:
            transport, unread = None, 0
        if transport is None or unread:
            # Not the stream-based connection this knows (another redis-py), or
            # bytes already read past the handshake: leave it to redis-py.
            self.lean = False
            await connection.disconnect()
            return None
        protocol = _WireProtocol(self, loop, transport, connection)
        transport.set_protocol(protocol)
        if not transport.is_reading():
            transport.resume_reading()
        return protocol

    # -- calls redis-py finishes ------------------------------------------------------

    def _through_redis_py_later(self, call: Flight, *, resend: bool) -> None:
        task = self._spawn(self._through_redis_py(call, resend=resend))
        task.add_done_callback(_end_when_cancelled(call))

    async def _through_redis_py(self, call: Flight, *, resend: bool) -> None:
        """Run ``call`` through redis-py, once more if its connection broke (``resend``)."""
        script, sent = call.script, call.call
        try:
            try:
                reply = await script(keys=sent.keys, args=sent.args)
            except LOST_REPLY:
                if not resend:
                    raise
                reply = await script(keys=sent.keys, args=sent.args)
        except GeneratorExit:
            raise  # collected with its closed event loop: nobody is left to tell
        except asyncio.CancelledError:
            raise  # the loop is ending: see _end_when_cancelled
        except BaseException as error:
            call.land(error=error)
            if not isinstance(error, Exception):
                raise
            return
        call.land(reply)

    def _refused(self, call: Flight, error: ResponseError) -> None:
        """An error reply: a script the server does not know is run by redis-py."""
        if isinstance(error, NoScriptError):
            # Not run: redis-py loads the script (choosing its variant) and runs it.
            self._through_redis_py_later(call, resend=True)
            return
        call.land(error=permission_error(error) or error)

    def _lost(
        self, protocol: _WireProtocol, calls: Sequence[Flight], timed_out: str, lost: str
    ) -> None:
        """``protocol``'s connection ended with ``calls`` unanswered."""
        if self._protocol is protocol:
            self._protocol = None
        for call in calls:
            if timed_out:
                call.land(error=RedisTimeoutError(timed_out))
            elif call.resent:
                call.land(error=RedisConnectionError(lost))
            else:
                # It may or may not have run: sent once more, with its request id,
                # on a new connection (a pooled one of redis-py may be as dead).
                call.resent = True
                self._send_later(protocol.loop, call)


def _ended(call: Flight, *, sent: bool | None = None) -> RedisConnectionError:
    """The outcome of a call cut short by its event loop's end.

    ``asyncio.run`` cancels every task left when its main coroutine returns,
    the wire's own too (a connection being made, a call redis-py runs). The
    calls those tasks carried end with a connection error, as when a
    connection breaks: an acquire that may have been granted counts as not
    held (the lock expires by itself) and a release that may not have run
    drops its hold (nothing renews it). Left unlanded, the finishing work of
    a cancelled caller would wait for them for ever, and so would the
    client's close, which waits for that work.
    """
    sent = call.resent if sent is None else sent
    return RedisConnectionError(
        "the event loop ended before the lock call's reply came"
        if sent
        else "the event loop ended before the lock call was sent"
    )


def _end_when_cancelled(call: Flight) -> Callable[[asyncio.Task[None]], None]:
    def ended(task: asyncio.Task[None]) -> None:
        if task.cancelled():  # also before it began, when no except clause could run
            call.land(error=_ended(call, sent=True))

    return ended


class _WireProtocol(asyncio.Protocol):
    """The taken-over socket: writes calls, parses replies, hands each to its call."""

    def __init__(
        self,
        wire: Wire,
        loop: asyncio.AbstractEventLoop,
        transport: Any,
        connection: Any,
    ) -> None:
        self.loop = loop
        #: True until the connection is closed or lost: calls may be written.
        self.open = True
        self._wire = wire
        self._transport = transport
        # The redis-py connection that opened the socket, and its stream
        # writer: dropped while the socket is in use, they would close it.
        self._connection: Any = connection
        self._where = repr(connection)
        timeout = connection.socket_timeout
        self._timeout: float | None = float(timeout) if timeout else None
        self._timer: asyncio.TimerHandle | None = None
        self._timed_out = ""
        self._time = loop.time
        self._calls: collections.deque[Flight] = collections.deque()
        self._reader = hiredis.Reader(
            protocolError=InvalidResponse, replyError=BaseParser.parse_error
        )

    def send(self, call: Flight) -> None:
        packed = call.packed
        if packed is None:
            sent = call.call
            packed = resp.evalsha(call.script.sha, sent.keys, sent.args, sent.rid)
        self._transport.write(packed)
        if self._timeout is not None:
            call.sent_at = self._time()
            if self._timer is None:
                self._timer = self.loop.call_later(self._timeout, self._check_timeout)
        self._calls.append(call)

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        calls = self._calls
        try:
            while (reply := reader.gets()) is not False:
                if _PUSH is not None and type(reply) is _PUSH:
                    continue  # a RESP3 push message (none is asked for): not a reply
                call = calls.popleft()
                if isinstance(reply, ResponseError):
                    self._wire._refused(call, reply)
                elif (waiter := call.waiter).done():
                    call.land(reply)  # its caller was cancelled: see Flight.hand_over
                else:
                    waiter.set_result(reply)
        except (InvalidResponse, IndexError) as error:
            # Garbled, or a reply nobody asked for: the stream cannot be trusted.
            logger.warning("lock call connection out of step, reconnecting: %r", error)
            self._end()

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        calls = list(self._calls)
        self._calls.clear()
        lost = f"Connection to {self._where} lost: {exc or 'closed by server'}"
        self._wire._lost(self, calls, self._timed_out, lost)
        self._forget_connection()

    def close(self) -> None:
        """Close after the calls written so far are flushed."""
        self.open = False
        self._transport.close()

    def abandon(self) -> None:
        """Drop a connection of another (possibly closed) event loop."""
        self.open = False
        try:
            self._transport.abort()
        except RuntimeError:  # its loop is closed: nothing more can be done there
            self._forget_connection()

    def _forget_connection(self) -> None:
        # The socket is closed: redis-py's connection is told it has no streams
        # any more, or it would warn of an unclosed connection when collected.
        connection, self._connection = self._connection, None
        if connection is not None:
            connection._reader = connection._writer = None

    def _end(self) -> None:
        self.open = False
        self._transport.abort()

    def _check_timeout(self) -> None:
        self._timer = None
        if not self._calls or not self.open:
            return
        left = self._calls[0].sent_at + self._timeout - self.loop.time()  # type: ignore[operator]  # set when armed
        if left > 0:
            self._timer = self.loop.call_later(left, self._check_timeout)
            return
        self._timed_out = f"Timeout reading from {self._where}"
        self._end()
