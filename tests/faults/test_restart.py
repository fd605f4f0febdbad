"""Fault 1: Redis restarted while a lock is held.

Without persistence the restarted server has forgotten the lock: the holder
must be told within one renewal interval of the server coming back. With
``appendonly yes`` + ``appendfsync always`` every grant and renewal is on disk
before it is acknowledged, so the hold survives the restart untouched.
"""

from __future__ import annotations

import time

import pytest
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_rlock.core import LockClient, LockLostError
from tests.faults.conftest import TIMEOUT, ServerFactory
from tests.faults.recorder import LockWatch
from tests.servers import RedisServer

pytestmark = pytest.mark.faults


def _restart(server: RedisServer, down_for: float, *, crash: bool = False) -> float:
    """SHUTDOWN NOSAVE (or SIGKILL), wait ``down_for`` s, start again; when it answered again."""
    assert server.process is not None
    if crash:
        server.process.kill()
    else:
        # No retries: redis-py would otherwise retry the dropped connection for seconds.
        with server.client(retry=Retry(NoBackoff(), 0)) as admin:
            admin.shutdown(nosave=True)
    server.process.wait(10)
    time.sleep(down_for)
    server.start()
    return time.monotonic()


def test_restart_without_persistence_tells_the_holder_within_one_interval(
    start_server: ServerFactory,
) -> None:
    server = start_server()
    with LockClient(server.url, key_prefix="f", watchdog_timeout=TIMEOUT) as client:
        lock = client.lock("restart")
        assert lock.acquire()
        watch = LockWatch(lock)
        watch.wait_for_renewal()
        back_at = _restart(server, down_for=0.2)
        assert watch.lost.wait(2 * TIMEOUT)
        assert watch.lost_at is not None and watch.lost_at > back_at
        print(f"FIGURES restart: told {watch.lost_at - back_at:.3f}s after Redis answered again")
        # One renewal interval, plus what one renewal call may take.
        assert watch.lost_at - back_at <= TIMEOUT / 3 + TIMEOUT / 6
        assert lock.lost
        with pytest.raises(LockLostError):
            lock.release()
        # The lock is usable again at once: the server has it free.
        assert lock.acquire(blocking=False)
        lock.release()


@pytest.mark.parametrize("how", ["shutdown-nosave", "crash"])
def test_restart_with_appendfsync_always_keeps_the_hold(
    how: str, start_server: ServerFactory
) -> None:
    server = start_server("--appendonly", "yes", "--appendfsync", "always")
    with LockClient(server.url, key_prefix="f", watchdog_timeout=TIMEOUT) as client:
        lock = client.lock("durable")
        assert lock.acquire()
        assert lock.acquire()  # a re-entry, to check the hold count survives too
        token = lock.token
        watch = LockWatch(lock)
        watch.wait_for_renewal()
        # A crash (SIGKILL) is the harder case: nothing is flushed on the way out.
        _restart(server, down_for=0.2, crash=how == "crash")
        for _ in range(2):
            watch.wait_for_renewal()
        assert not watch.lost.is_set() and not lock.lost
        assert lock.hold_count() == 2 and lock.token == token
        lock.release()
        lock.release()
        assert not lock.locked()


def test_tokens_keep_increasing_across_a_restart_without_persistence(
    start_server: ServerFactory,
) -> None:
    """The restarted server has forgotten every counter: the clock floor carries tokens on."""
    server = start_server()
    with LockClient(server.url, key_prefix="f", watchdog_timeout=TIMEOUT) as client:
        lock = client.lock("counted")
        tokens: list[int] = []
        for restart in (False, False, True, False):
            if restart:
                _restart(server, down_for=0.1)
            with lock:
                assert lock.token is not None
                tokens.append(lock.token)
        assert tokens == sorted(set(tokens)), tokens
