"""Fault 6 for semaphores: acquire or release ran, but the reply was lost on the way back.

The semaphore's scripts keep the lock's request latch: a resent call reports
the first call's outcome, so an owner's permits stay exact (never one taken
twice, never one given back twice), and a call that found no permit free is
never latched (its resend is a new attempt, not a reported grant).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from django_rlock.core import LockClient
from django_rlock.core._process.identity import thread_owner
from django_rlock.core._protocol.semaphore import permit_key
from tests.faults.proxy import FaultProxy
from tests.faults.test_lost_reply import retrying_client
from tests.servers import RedisServer

pytestmark = pytest.mark.faults


@pytest.mark.parametrize("resender", ["redis-py retries", "the engine resends"])
def test_resent_permit_acquires_and_releases_apply_once(
    private_server: RedisServer, proxy: FaultProxy, resender: str
) -> None:
    direct = private_server.client()
    caller = retrying_client(proxy.port) if resender == "redis-py retries" else proxy.url
    with LockClient(caller, key_prefix="f") as client:
        pool = client.semaphore("reply", 3)
        assert pool.acquire()  # loads the scripts: from now on each call is one EVALSHA
        pool.release()
        key = permit_key(pool.keys, thread_owner())

        steps: list[tuple[Callable[[], object], int]] = [
            (pool.acquire, 1),
            (pool.acquire, 2),  # a second permit of the same owner
            (pool.acquire, 3),
            (pool.release, 2),
            (pool.release, 1),
            (pool.release, 0),  # the last: no LockLostError, nothing more freed
        ]
        for number, (call, held) in enumerate(steps, start=1):
            proxy.drop_reply_after(b"EVALSHA")
            call()
            assert proxy.dropped_replies == number
            assert int(direct.hget(key, thread_owner()) or 0) == held
            assert pool.hold_count() == held
            assert pool.available() == 3 - held
        assert not pool.lost
        assert not direct.exists(pool.keys.hash)
    direct.close()
    if not isinstance(caller, str):
        caller.close()
