"""A holder always knows before a rival can hold: the local deadline never outlives the key.

Every call that sets or extends a hold's key (a grant, a re-entry, a renewal, a
retry the request latch reports) makes the holder's local deadline the call's
*send* time plus the PTTL the server reports in its reply, less Redlock's
allowance for clock drift (1% + 2 ms: Redis counts the PTTL on its own clock),
and no call shortens a held key. So a partition or a lost reply can never leave
the holder believing it holds a lock that a rival has already been granted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis

from django_rlock.core import LockClient, LockUnavailableError
from django_rlock.core._process.identity import thread_owner
from django_rlock.core._protocol import clock
from tests.faults.conftest import TIMEOUT
from tests.faults.proxy import FaultProxy
from tests.faults.recorder import LockWatch, current_hold
from tests.servers import RedisServer

pytestmark = pytest.mark.faults

#: A fixed lease well past the watchdog timeout (1.5 s), so the two disagree.
LEASE = 4.0


@pytest.fixture
def rival_client(private_server: RedisServer) -> Iterator[LockClient]:
    """A client of the server itself (no proxy): it stays connected through every fault."""
    with LockClient(private_server.url, key_prefix="f", watchdog_timeout=TIMEOUT) as client:
        yield client


def _rival_grant(
    rival_client: LockClient, name: str, wait: float
) -> tuple[threading.Thread, list[float]]:
    """Start a rival waiting up to ``wait`` s for ``name``; the list gets when it was granted."""
    granted_at: list[float] = []

    def rival() -> None:
        lock = rival_client.lock(name)
        if lock.acquire(timeout=wait):
            granted_at.append(time.monotonic())
            lock.release()

    thread = threading.Thread(target=rival)
    thread.start()
    return thread, granted_at


def test_a_watchdog_hold_with_a_lease_reentry_is_told_before_a_rival_is_granted(
    proxy: FaultProxy, rival_client: LockClient
) -> None:
    """A watchdog hold with a lease re-entry inside, then a partition.

    The renewal must not cut the key back to the watchdog timeout while the
    holder counts on the lease: the key lives to the later of the two, and the
    holder is told of the loss before that.
    """
    with LockClient(proxy.url, key_prefix="f", watchdog_timeout=TIMEOUT) as holder_client:
        lock = holder_client.lock("mixed")
        for lease in (None, LEASE):
            assert lock.acquire(lease=lease)
        watch = LockWatch(lock)
        watch.wait_for_renewal()  # the watchdog has renewed the mixed hold
        proxy.blackhole()
        partitioned_at = time.monotonic()
        thread, granted_at = _rival_grant(rival_client, "mixed", wait=LEASE + 2 * TIMEOUT)
        thread.join(LEASE + 4 * TIMEOUT)
        proxy.heal()
        assert granted_at, "the rival never got the lock"
        assert watch.lost.wait(2 * TIMEOUT), "the holder was never told"
        assert watch.lost_at is not None
        print(
            f"FIGURES mixed watchdog-outer: rival granted {granted_at[0] - partitioned_at:.3f}s "
            f"into the partition, holder told {granted_at[0] - watch.lost_at:+.3f}s before it"
        )
        assert watch.lost_at < granted_at[0]
        assert lock.lost


def test_a_lease_hold_with_a_watchdog_reentry_inside_ends_with_its_lease(
    proxy: FaultProxy, rival_client: LockClient
) -> None:
    """A lease hold stays a lease: a watchdog re-entry neither renews it nor cuts it short.

    (Before, the re-entry turned it into a watchdog hold: renewed for as long as
    its thread lived, and reported leaked and given back at its request's end.)
    """
    with LockClient(proxy.url, key_prefix="f", watchdog_timeout=TIMEOUT) as holder_client:
        lock = holder_client.lock("lease-outer")
        sent_at = clock.monotonic()
        assert lock.acquire(lease=LEASE)
        assert lock.acquire()  # a helper's watchdog-style re-entry
        hold = current_hold(lock)
        assert not hold.watchdog and hold.count == 2
        # The holder's deadline never outlives the key, which lives to the lease's end.
        assert hold.deadline <= sent_at + LEASE
        proxy.blackhole()  # whatever the client would send now cannot land
        thread, granted_at = _rival_grant(rival_client, "lease-outer", wait=LEASE + 2 * TIMEOUT)
        thread.join(LEASE + 4 * TIMEOUT)
        proxy.heal()
        assert granted_at, "the rival never got the lock"
        granted_after = granted_at[0] - sent_at
        print(f"FIGURES lease-outer: rival granted {granted_after:.3f}s after the lease began")
        # Not cut to the watchdog timeout (1.5 s), not renewed past the lease.
        assert LEASE - 0.1 < granted_after < LEASE + 2 * TIMEOUT


def test_a_retried_acquire_reported_by_the_latch_counts_from_the_server_s_ttl(
    private_server: RedisServer, proxy: FaultProxy, rival_client: LockClient
) -> None:
    """The first acquire ran but its reply never came; the retry is reported, not applied.

    The grant happened at the first call, so the key has only what is left of
    its lease: the retry's send time plus the lease would outlive it.
    """
    caller = redis.Redis.from_url(proxy.url, socket_timeout=0.3, retry_on_error=[], retry=None)
    try:
        with LockClient(caller, key_prefix="f", watchdog_timeout=TIMEOUT) as client:
            lock = client.lock("retried")
            assert lock.acquire(blocking=False)  # loads the script: one EVALSHA from now on
            lock.release()
            proxy.swallow_reply_after(b"EVALSHA")
            with pytest.raises(LockUnavailableError):  # the reply timed out
                lock.acquire(lease=2.0)
            assert private_server.client().hexists(lock.keys.hash, thread_owner())
            time.sleep(1.5)
            assert lock.acquire(lease=2.0, blocking=False)  # the latch reports the first grant
            server_left = private_server.client().pttl(lock.keys.hash) / 1000
            local_left = current_hold(lock).deadline - time.monotonic()
            print(
                f"FIGURES retried acquire: deadline in {local_left:.3f}s locally, "
                f"key expires in {server_left:.3f}s on the server"
            )
            assert local_left <= server_left
            assert lock.hold_count() == 1

            thread, granted_at = _rival_grant(rival_client, "retried", wait=4.0)
            thread.join(6.0)
            assert granted_at, "the rival never got the lock"
            # The rival holds (or held) the lock: its owner must know by now.
            assert lock.lost
    finally:
        caller.close()


def test_a_hold_s_deadline_ends_the_clock_drift_allowance_before_its_key(
    rival_client: LockClient, private_server: RedisServer
) -> None:
    """The holder stops believing 1% + 2 ms before the server's TTL runs out.

    The CI once showed a reader granted 4.7 ms before its rival writer's
    local deadline, with no fault: the server's own PTTL replies placed the
    write key's expiry 6 ms before the deadline its 2 s re-entry reply had
    set. Redis expires keys by its wall clock; a deadline with no allowance
    for that clock running ahead is one a holder can outlive.
    """
    lock = rival_client.lock("drift")
    assert lock.acquire(lease=60.0)  # an allowance of 602 ms: calls' latency is small beside it
    try:
        deadline = current_hold(lock).deadline
        asked = time.monotonic()
        ttl = private_server.client().pttl(lock.keys.hash) / 1000
        allowance = clock.drift(ttl)
        # The key expires no sooner than asked + ttl: the PTTL was read after `asked`.
        # Half the allowance is left to the calls' own latency.
        assert deadline <= asked + ttl - allowance / 2
        assert deadline > asked + ttl - allowance - 0.5  # the allowance, not much more
    finally:
        lock.release()
