"""Fencing tokens: strictly increasing per name, also when Redis loses its data.

A token is never below a floor taken from the server's clock (microseconds
since the epoch), so a FLUSHALL, a restart without persistence or a failover
that lost the last token cannot send tokens back to 1; and the token may
therefore live in the lock's hash, kept a minute after a release, instead of
in a counter living forever.
"""

from __future__ import annotations

import time

import pytest
import redis

from django_rlock.core import LockClient, LockLostError
from django_rlock.core._process.identity import thread_owner
from django_rlock.core._protocol.lua import REQUEST_LATCH_MS
from tests.lockhash import owner_counts

#: The largest integer a Lua number (a double) holds exactly; tokens stay below it.
LUA_EXACT = 2**53


def server_micros(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1_000_000 + int(micros)


def test_tokens_keep_increasing_across_a_flushall(lock_client: LockClient, r: redis.Redis) -> None:
    lock = lock_client.lock("flushed")
    tokens = []
    for _ in range(3):
        with lock:
            assert lock.token is not None
            tokens.append(lock.token)
        r.flushall()  # the counter is gone with everything else
    assert tokens == sorted(set(tokens)), tokens


def test_a_token_is_at_least_the_server_clock_in_microseconds(
    lock_client: LockClient, r: redis.Redis
) -> None:
    before = server_micros(r)
    with lock_client.lock("clocked") as lock:
        token = lock.token
    after = server_micros(r)
    assert token is not None
    assert before <= token <= after < LUA_EXACT
    assert token < 2**63 - 1  # a Postgres bigint column holds it


def test_a_counter_ahead_of_the_clock_still_goes_up_by_one(
    lock_client: LockClient, r: redis.Redis
) -> None:
    """Tokens from a server whose clock ran ahead (then stepped back): no repeat, no step down."""
    lock = lock_client.lock("ahead")
    ahead = server_micros(r) + 3_600_000_000  # an hour ahead of this server's clock
    r.hset(lock.keys.latches, "~t", ahead)  # as a release left it
    with lock:
        assert lock.token == ahead + 1
    with lock:
        assert lock.token == ahead + 2


def test_the_token_lives_in_the_lock_and_a_release_keeps_it_a_minute(
    lock_client: LockClient, r: redis.Redis
) -> None:
    lock = lock_client.lock("short")
    with lock:
        assert lock.acquire(lease=60)  # a re-entry keeps its grant's token
        # A held lock is one key: its token is a field of its hash.
        assert r.hget(lock.keys.hash, "~t") == str(lock.token).encode()
        assert not r.exists(lock.keys.fence, lock.keys.latches)
        lock.release()
        token = lock.token
    assert not r.exists(lock.keys.hash)
    # What the release left: the released token, for as long as its request id.
    assert r.hget(lock.keys.latches, "~t") == str(token).encode()
    assert 0 < r.pttl(lock.keys.latches) <= REQUEST_LATCH_MS

    r.delete(lock.keys.latches)  # gone (expired, or lost by Redis): the clock floor
    with lock:
        assert token is not None and lock.token is not None and lock.token > token


def test_renewals_keep_the_token_with_the_lock(r: redis.Redis, redis_url: str) -> None:
    with LockClient(redis_url, key_prefix="test", watchdog_timeout=0.6) as client:
        lock = client.lock("renewed")
        with lock:
            token = lock.token
            time.sleep(1.5)  # several renewals, past the first expiry
            assert int(r.hget(lock.keys.hash, "~t") or 0) == token
            assert not lock.lost


def test_released_names_leave_only_their_latches_for_a_minute(
    lock_client: LockClient, r: redis.Redis
) -> None:
    for number in range(2_000):
        lock = lock_client.lock(f"many:{number}")
        lock.acquire(lease=0.3)
        lock.release()
    time.sleep(0.4)
    left = list(r.scan_iter("test:*"))
    assert len(left) == 2_000 and all(key.endswith(b"}:req") for key in left)
    assert all(0 < r.pttl(key) <= REQUEST_LATCH_MS for key in left[:20])


def test_a_grant_after_a_declared_loss_is_new_even_if_the_key_lived_on(
    lock_client: LockClient, r: redis.Redis
) -> None:
    """Found by the model soak: a hold declared lost on its local deadline while the
    key lived on (a stall, a lost reply) came back as a re-entry of the same grant:
    the same token, and a hold count the owner never gave back."""
    lock = lock_client.lock("revived")
    lock.acquire()
    lost_token = lock.token
    (hold,) = lock_client.watched_holds()
    lock_client.declare_lost(hold, "the local deadline passed")
    assert lock.lost and r.exists(lock.keys.hash)  # the server still has the hold
    with pytest.raises(LockLostError):
        lock.release()  # the owner hears of it (no call: the hold is known lost)

    assert lock.acquire(blocking=False)
    assert lock.token is not None and lost_token is not None and lock.token > lost_token
    assert not lock.lost and lock.hold_count() == 1
    assert list(owner_counts(r, lock.keys.hash).values()) == [1]
    lock.release()
    assert not r.exists(lock.keys.hash)  # nothing the owner was told is gone stays held


def test_a_closed_clients_lost_hold_is_not_revived_through_a_new_client(
    redis_url: str, r: redis.Redis
) -> None:
    """Found by the model soak: owner ids belong to the thread, not the client, so a
    new client (override_settings rebuilds them) re-entered the closed one's grant."""
    old = LockClient(redis_url, key_prefix="test")
    lock = old.lock("reopened")
    lock.acquire()  # watchdog-renewed: closing its client declares it lost
    lost_token = lock.token
    old.close()
    with LockClient(redis_url, key_prefix="test") as new:
        again = new.lock("reopened")
        assert again.acquire(blocking=False)
        assert again.token is not None and lost_token is not None and again.token > lost_token
        assert list(owner_counts(r, again.keys.hash).values()) == [1]
        again.release()
    assert not r.exists(lock.keys.hash)


def test_a_lost_grant_is_taken_off_whole_even_with_reentries_its_owner_never_heard_of(
    lock_client: LockClient, r: redis.Redis
) -> None:
    # Found by the model soak: a re-entry Redis applied but whose reply was lost
    # left the server counting one more hold than the client declared lost, so
    # the owner's next acquire re-entered the lost grant, with its old token.
    lock = lock_client.lock("uncounted")
    assert lock.acquire()
    first = lock.token
    r.hincrby(lock.keys.hash, thread_owner(), 1)  # the re-entry the client never heard of
    hold = lock_client.holds.newest(lock.keys.hash, thread_owner())
    assert hold is not None
    lock_client.holds.declare_lost(hold, "its deadline passed without a renewal")
    assert lock.acquire()
    assert first is not None and lock.token is not None and lock.token > first
    assert list(owner_counts(r, lock.keys.hash).values()) == [1]
    lock.release()
    assert not lock.locked()


def test_holds_the_server_counts_beyond_the_clients_go_before_the_next_grant(
    lock_client: LockClient, r: redis.Redis
) -> None:
    """Found with the model soak's finding: the server counted a hold the client did not.

    A re-entry Redis applied but whose reply never came (or a release that never
    ran after the client gave the hold up) leaves the server one hold ahead. The
    client's last release then left the lock held, and the owner's next acquire
    re-entered that hold: the old token handed out as a new grant, and the lock
    outliving the owner's release again. That acquire now takes those holds off first.
    """
    lock = lock_client.lock("overcounted")
    assert lock.acquire(lease=30)
    first = lock.token
    r.hincrby(lock.keys.hash, thread_owner(), 1)  # the re-entry the client never heard of
    lock.release()  # the client's last hold; the server still counts one
    assert lock.token is None and owner_counts(r, lock.keys.hash) == {thread_owner(): 1}
    assert lock.acquire(blocking=False)
    assert first is not None and lock.token is not None and lock.token > first
    assert list(owner_counts(r, lock.keys.hash).values()) == [1]
    lock.release()
    assert not lock.locked()


def test_a_thread_holding_through_two_clients_keeps_both_holds(
    lock_client: LockClient, redis_url: str, r: redis.Redis
) -> None:
    """Owner ids are per thread, so a thread may hold one lock through two clients.

    Giving back the second client's hold leaves the first's on the server: that
    one is still held, not a hold to take off at the next acquire.
    """
    lock = lock_client.lock("twice")
    assert lock.acquire(lease=30)
    first = lock.token
    with LockClient(redis_url, key_prefix="test") as other:
        again = other.lock("twice")
        assert again.acquire(blocking=False)  # a re-entry of the same grant
        assert again.token == first
        again.release()  # the server still counts the first client's hold
    assert lock.acquire(blocking=False)  # a re-entry still: nothing was taken off
    assert lock.token == first and not lock.lost
    assert owner_counts(r, lock.keys.hash) == {thread_owner(): 2}
    lock.release()
    lock.release()
    assert not lock.locked()
