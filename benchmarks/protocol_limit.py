"""The protocol's own speed: the library's ACQUIRE and RELEASE scripts on a raw socket.

What an uncontended acquire+release would cost with no Python around the
protocol but the loop itself: the very scripts a :class:`~django_rlock.core.RLock`
sends (the same keys and arguments, built once with
:mod:`django_rlock.core._protocol.calls`, a fresh request id per call), packed
by hand into RESP with every constant part encoded once, written with one
``sendall`` and parsed with one ``hiredis.Reader``. No pool, no retry policy,
no hold registry, no request-id bookkeeping: the limit the library's own path
is measured against (``make bench`` prints it as a row of its own).

``redis_py_lock_protocol`` does the same for redis-py's ``Lock`` (``SET NX PX``
and its release script), the peer's limit.

Run alone: ``python -m benchmarks.protocol_limit`` (a fresh redis-server).
"""

from __future__ import annotations

import argparse
import itertools
import socket
import time
from collections.abc import Callable
from typing import NamedTuple
from urllib.parse import urlsplit

import hiredis
import redis

from django_rlock.core._process.holder import describe
from django_rlock.core._protocol.calls import acquire_call, release_call
from django_rlock.core._protocol.lock import ACQUIRE, ALLOW_OOM, RELEASE
from django_rlock.core._protocol.names import LockKeys


def _bulk(value: str | int | bytes) -> bytes:
    data = value if isinstance(value, bytes) else str(value).encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def _connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _caller(sock: socket.socket) -> Callable[[bytes], object]:
    """One request, one reply: ``sendall`` and hiredis, nothing else."""
    reader = hiredis.Reader()
    buffer = bytearray(65536)

    def call(packed: bytes) -> object:
        sock.sendall(packed)
        reply = reader.gets()
        while reply is False:
            # hiredis reads any buffer; its stub says bytes only.
            reader.feed(buffer, 0, sock.recv_into(buffer))  # type: ignore[arg-type]
            reply = reader.gets()
        if isinstance(reply, hiredis.ReplyError):
            raise RuntimeError(reply)
        return reply

    return call


def _evalsha_head(sha: str, count: int) -> bytes:
    # *<elements> EVALSHA <sha> <numkeys>: the keys and arguments follow.
    return b"*%d\r\n$7\r\nEVALSHA\r\n%s" % (count, _bulk(sha))


class OurCalls(NamedTuple):
    """The plain lock's two calls, encoded once; a request id completes each."""

    acquire_head: bytes
    acquire_tail: bytes
    release_head: bytes

    def acquire(self, rid: int) -> bytes:
        """The acquire command with request id ``rid``."""
        return self.acquire_head + _bulk(rid) + self.acquire_tail

    def release(self, rid: int) -> bytes:
        """The release command with request id ``rid``."""
        return self.release_head + _bulk(rid)


def our_calls(url: str, keys: LockKeys, owner: str) -> OurCalls:
    """The library's acquire and release of ``keys`` by ``owner``, as an RLock sends them.

    The scripts are loaded on ``url``; what does not change between cycles is
    encoded here once, the request id (ARGV[5] of the acquire, ARGV[3] of the
    release) goes between.
    """
    admin = redis.Redis.from_url(url)
    acquire_sha = admin.script_load(ACQUIRE)
    release_sha = admin.script_load(ALLOW_OOM + RELEASE)
    admin.close()
    sample = acquire_call(
        keys, owner, ttl=30.0, waiter_id="", sleep=0.0, rid="0", holder=describe()
    )
    free = release_call(keys, owner, "publish", "0")
    return OurCalls(
        acquire_head=(
            _evalsha_head(acquire_sha, 3 + len(sample.keys) + len(sample.args))
            + _bulk(len(sample.keys))
            + b"".join(_bulk(key) for key in sample.keys)
            + b"".join(_bulk(arg) for arg in sample.args[:4])
        ),
        acquire_tail=b"".join(_bulk(arg) for arg in sample.args[5:]),
        release_head=(
            _evalsha_head(release_sha, 3 + len(free.keys) + len(free.args))
            + _bulk(len(free.keys))
            + b"".join(_bulk(key) for key in free.keys)
            + b"".join(_bulk(arg) for arg in free.args[:2])
        ),
    )


def our_protocol(url: str, cycles: int, name: str = "protocol-limit") -> float:
    """Acquire+release cycles per second of the library's own scripts, on a raw socket."""
    calls = our_calls(url, LockKeys.build("bench", name), "0123456789abcdef0123456789abcdef:1")
    rids = itertools.count(1)
    sock = _connect(url)
    call = _caller(sock)
    try:

        def cycle() -> None:
            granted = call(calls.acquire(next(rids)))
            assert isinstance(granted, list), granted
            assert call(calls.release(next(rids))) == 0

        return _rate(cycle, cycles)
    finally:
        sock.close()


def redis_py_lock_protocol(url: str, cycles: int, name: str = "protocol-limit-peer") -> float:
    """The same for redis-py's Lock: ``SET NX PX`` and its release script, on a raw socket."""
    admin = redis.Redis.from_url(url)
    release_sha = admin.script_load(redis.lock.Lock.LUA_RELEASE_SCRIPT)
    admin.close()
    key = _bulk(name)
    set_head, set_tail = b"*6\r\n" + _bulk("SET"), _bulk("NX") + _bulk("PX") + _bulk(30000)
    tokens = itertools.count(1)
    sock = _connect(url)
    call = _caller(sock)
    try:

        def cycle() -> None:
            token = _bulk(b"%032d" % next(tokens))
            assert call(set_head + key + token + set_tail) == b"OK"
            assert call(_evalsha_head(release_sha, 5) + b"$1\r\n1\r\n" + key + token) == 1

        return _rate(cycle, cycles)
    finally:
        sock.close()


def _rate(cycle: Callable[[], None], cycles: int) -> float:
    for _ in range(20):
        cycle()
    started = time.perf_counter()
    for _ in range(cycles):
        cycle()
    return cycles / (time.perf_counter() - started)


def main() -> None:
    from tests.servers import RedisServer  # noqa: PLC0415 -- only the standalone run starts one

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cycles", type=int, default=3000)
    args = parser.parse_args()
    with RedisServer() as server:
        ours = our_protocol(server.url, args.cycles)
        peer = redis_py_lock_protocol(server.url, args.cycles)
        client = redis.Redis.from_url(server.url)
        lock = client.lock("redis-py-lock", timeout=30)
        started = time.perf_counter()
        for _ in range(args.cycles):
            lock.acquire()
            lock.release()
        redis_py = args.cycles / (time.perf_counter() - started)
    print(f"our scripts, raw socket:      {ours:9,.0f}/s  {ours / redis_py:.2f}x redis-py Lock")
    print(f"redis-py Lock's, raw socket:  {peer:9,.0f}/s  {peer / redis_py:.2f}x redis-py Lock")
    print(f"redis-py Lock:                {redis_py:9,.0f}/s")


if __name__ == "__main__":
    main()
