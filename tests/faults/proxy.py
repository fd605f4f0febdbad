"""A TCP proxy on loopback that can misbehave on command: the network faults of the suite.

::

    with FaultProxy(server.port) as proxy:
        client = LockClient(proxy.url)
        proxy.blackhole()          # a partition: bytes go nowhere, calls time out
        proxy.heal()
        proxy.stall()              # bytes wait, undelivered, until proxy.resume()
        proxy.drop_reply_after(b"EVALSHA")   # the server runs it, the reply is lost
        proxy.cut()                # every connection closed now (a reset)

Every connection is pumped by two threads that wake at least every
:data:`TICK` seconds, so they notice :meth:`FaultProxy.close` (or the
``lifetime`` running out) and end by themselves; ``close`` joins them with a
bounded wait. A blackholed proxy still accepts connections, as a partitioned
network accepts nothing but also refuses nothing: callers find out by timeout.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from dataclasses import dataclass, field

__all__ = ["TICK", "FaultProxy"]

#: How often a pump thread looks up from its socket to check for faults and close.
TICK = 0.05


@dataclass(eq=False)
class _Pair:
    """One proxied connection: the client's socket and the server's."""

    downstream: socket.socket
    upstream: socket.socket
    #: Set when a matching request went up: its reply is to be dropped.
    drop_next_reply: bool = False
    swallow_replies: bool = False
    closed: threading.Event = field(default_factory=threading.Event)

    def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.downstream, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class FaultProxy:
    """Forwards 127.0.0.1:``port`` to 127.0.0.1:``target_port`` until told otherwise.

    ``lifetime`` bounds how long it may run at all: past it, the proxy closes
    itself, so a test that forgets to close it cannot leave threads behind.
    """

    def __init__(self, target_port: int, *, lifetime: float = 600.0) -> None:
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(TICK)
        self.port: int = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._stop_at = time.monotonic() + lifetime
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._threads: list[threading.Thread] = []
        self._blackholed = False
        self._stalled = False
        self._drop_reply_match: bytes | None = None
        self._swallow_reply_match: bytes | None = None
        #: Replies dropped by :meth:`drop_reply_after` so far.
        self.dropped_replies = 0
        self._accepter = self._spawn(self._accept, "fault-proxy-accept")

    @property
    def url(self) -> str:
        """A redis URL of the proxy (database 0)."""
        return f"redis://127.0.0.1:{self.port}/0"

    # -- faults ------------------------------------------------------------------------

    def blackhole(self) -> None:
        """Stop forwarding in both directions; bytes that arrive are dropped."""
        self._blackholed = True

    def heal(self) -> None:
        """Forward again. Connections that lost bytes meanwhile are cut (their stream is torn)."""
        self._blackholed = False
        self.cut()

    def stall(self) -> None:
        """Stop forwarding in both directions; bytes wait in the sockets, none is lost."""
        self._stalled = True

    def resume(self) -> None:
        """Forward again after :meth:`stall`: what waited is delivered, in order."""
        self._stalled = False

    def drop_reply_after(self, match: bytes) -> None:
        """Once: forward the next request containing ``match``, then drop its reply and cut.

        The server executes the request; the client sees its connection reset
        before any reply, exactly what happens when a network fails mid-call.
        """
        self._drop_reply_match = match

    def swallow_reply_after(self, match: bytes) -> None:
        """Once: forward the next request containing ``match``, then drop its reply.

        Unlike :meth:`drop_reply_after` the connection stays open: the client
        waits out its socket timeout, as when a network goes quiet mid-call.
        """
        self._swallow_reply_match = match

    def cut(self) -> None:
        """Close every connection now (new ones are accepted as before)."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            pair.close()

    @property
    def connections(self) -> int:
        """Connections open through the proxy now."""
        with self._lock:
            return sum(not pair.closed.is_set() for pair in self._pairs)

    # -- lifecycle ---------------------------------------------------------------------

    def close(self, timeout: float = 5.0) -> None:
        """Stop accepting, close every connection and wait (bounded) for the threads."""
        self._stop.set()
        self.cut()
        deadline = time.monotonic() + timeout
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - time.monotonic()))
        self._listener.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def alive_threads(self) -> int:
        """Pump and accept threads still running (0 after :meth:`close`)."""
        return sum(thread.is_alive() for thread in self._threads)

    def _stopping(self) -> bool:
        if time.monotonic() >= self._stop_at:
            self._stop.set()
        return self._stop.is_set()

    def _spawn(self, target: object, name: str, *args: object) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)  # type: ignore[arg-type]
        self._threads.append(thread)
        thread.start()
        return thread

    # -- the threads -------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stopping():
            try:
                downstream, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=2)
            except OSError:
                downstream.close()  # the server is down: refuse, as it would
                continue
            pair = _Pair(downstream, upstream)
            with self._lock:
                self._pairs.append(pair)
                self._threads[:] = [thread for thread in self._threads if thread.is_alive()]
            self._spawn(self._pump, "fault-proxy-up", pair, True)
            self._spawn(self._pump, "fault-proxy-down", pair, False)
        self.cut()

    def _pump(self, pair: _Pair, up: bool) -> None:
        source, sink = (pair.downstream, pair.upstream) if up else (pair.upstream, pair.downstream)
        try:
            while not pair.closed.is_set() and not self._stopping():
                if self._stalled:
                    time.sleep(TICK)  # left unread: the bytes wait in the socket
                    continue
                readable, _, _ = select.select([source], [], [], TICK)
                if not readable:
                    continue
                data = source.recv(65536)
                if not data:
                    break
                if self._blackholed:
                    continue  # lost on the wire
                if up:
                    match = self._drop_reply_match
                    if match is not None and match in data:
                        self._drop_reply_match = None
                        pair.drop_next_reply = True
                    swallow = self._swallow_reply_match
                    if swallow is not None and swallow in data:
                        self._swallow_reply_match = None
                        pair.swallow_replies = True
                elif pair.swallow_replies:
                    self.dropped_replies += 1
                    continue  # never delivered; the connection stays open
                elif pair.drop_next_reply:
                    self.dropped_replies += 1
                    break  # the reply never arrives: the connection dies instead
                sink.sendall(data)
        except (OSError, ValueError):
            pass  # closed under us by cut() or close()
        finally:
            pair.close()
