"""``layout="redisson"``: a Python lock and Redisson's RLock of the same name are one lock.

The Java side is the Redisson emulator the conftest finds (Redisson's own Lua,
its client's waiting, watchdog and message decoding): see conftest.py. A
"Java thread" is a one-worker ThreadPoolExecutor, since Redisson's owner is
the thread. Watchdog timeouts are short (1.5 to 3 s) to keep this quick.
"""

from __future__ import annotations

import asyncio
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
import redis

from django_rlock.core import LockClient, LockLostError
from django_rlock.core.aio import AsyncLockClient
from tests.children import python_module, read_answer
from tests.faults.proxy import FaultProxy
from tests.interop.conftest import skip_without_sharded_pubsub
from tests.servers import RedisServer

#: Redisson's owner field: a Java UUID, ':', a thread id (a decimal long).
OWNER = re.compile(r"\A[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}:[0-9]+\Z")

#: A wake-up that came by message, not by the holder's lease running out (20 s here).
WOKEN = 2.0


@pytest.fixture
def client(redis_url: str, r: redis.Redis) -> Iterator[LockClient]:
    with LockClient(redis_url, layout="redisson", watchdog_timeout=3) as made:
        yield made


@pytest.fixture
def java_thread() -> Iterator[Callable[[Callable[..., Any]], Future[Any]]]:
    """``java_thread(fn, *args)``: run on one long-lived "Java thread" (one Redisson owner)."""
    with ThreadPoolExecutor(1, thread_name_prefix="java") as pool:
        yield pool.submit


def on_thread(target: Callable[[], Any]) -> Future[Any]:
    """Run ``target`` on a new Python thread (a new owner); its result as a future."""
    done: Future[Any] = Future()

    def run() -> None:
        try:
            done.set_result(target())
        except BaseException as error:  # noqa: BLE001 -- handed to the test
            done.set_exception(error)

    threading.Thread(target=run, daemon=True).start()
    return done


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def take_and_release(lock: Any, timeout: float = 8) -> tuple[bool, float]:
    """On the calling thread: wait for ``lock``, note when it came, give it back."""
    granted = lock.acquire(timeout=timeout)
    at = time.monotonic()
    if granted:
        lock.release()
    return granted, at


def test_a_python_hold_keeps_java_out_and_looks_like_a_java_hold(
    redisson: Any, client: LockClient, r: redis.Redis, emu: Any
) -> None:
    java = redisson().get_lock("order:42")
    lock = client.lock("order:42")
    assert lock.acquire(timeout=1)
    assert java.is_locked() and not java.try_lock_once()
    assert 0 < java.remain_time_to_live() <= 3000
    # The hash holds the owner's field alone, shaped as Redisson's <uuid>:<thread id>.
    fields = {text(field): text(count) for field, count in r.hgetall("order:42").items()}
    assert len(fields) == 1 and list(fields.values()) == ["1"]
    assert OWNER.match(next(iter(fields)))
    # Beside it, in the same slot: Redisson's token counter and this library's own keys.
    keys = {text(key) for key in r.keys("*")}
    assert "redisson_lock_token:{order:42}" in keys
    assert "rlock:redisson:{order:42}:holder" in keys
    assert len({emu.calc_slot(key) for key in keys}) == 1
    lock.release()
    assert not java.is_locked()
    # The counter expires with the lock, as the default layout's token does.
    assert 0 < r.pttl("redisson_lock_token:{order:42}") <= 3000
    assert java.try_lock_once()
    java.unlock()


def test_a_java_hold_keeps_python_out_and_python_sees_it(redisson: Any, client: LockClient) -> None:
    java = redisson().get_lock("order:43")
    assert java.try_lock_once()
    lock = client.lock("order:43")
    assert lock.locked() and not lock.owned() and lock.hold_count() == 0
    ttl = lock.ttl()
    assert ttl is not None and 0 < ttl <= 3
    assert not lock.acquire(blocking=False)
    assert not lock.acquire(timeout=0.2)
    java.unlock()
    assert not lock.locked()
    assert lock.acquire(blocking=False)
    lock.release()


def test_extend_leader_and_multilock_work_on_the_shared_lock(
    redisson: Any, client: LockClient, java_thread: Any
) -> None:
    java = redisson().get_lock("order:45")
    lock = client.lock("order:45")
    assert lock.acquire(lease=2)
    lock.extend(10)
    assert 9000 < java.remain_time_to_live() <= 10000  # Java sees the new expiry
    lock.release()
    with client.leader("order:45") as term:  # a leader's term is the shared lock
        assert term.token and not java_thread(java.try_lock_once).result()
    group = client.multi_lock(client.lock("order:45"), client.lock("order:46"))
    assert java_thread(java.try_lock_once).result()
    assert not group.acquire(timeout=0.2)  # Java holds a member: all or nothing
    java_thread(java.unlock).result()
    with group:
        assert java.is_locked() and not java_thread(java.try_lock_once).result()


def test_a_redlock_undoing_a_grant_whose_reply_was_lost_deletes_and_announces_it(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    """RedLock gives back a grant it was not told of on the member's own keys, waking Java."""
    with (
        FaultProxy(redis_server.port, lifetime=60) as proxy,
        LockClient(proxy.url, layout="redisson", watchdog_timeout=3) as through,
    ):
        member = through.lock("order:47")
        group = through.red_lock(member)
        with group:  # the scripts loaded: the EVALSHA below runs
            pass
        listening = r.pubsub()  # type: ignore[no-untyped-call, unused-ignore]  # redis-py's is untyped
        try:
            listening.subscribe(member.keys.channel)
            assert listening.get_message(timeout=WOKEN)["type"] == "subscribe"
            proxy.drop_reply_after(b"EVALSHA")  # the grant runs, its reply never comes
            assert not group.acquire(blocking=False)
            assert not r.exists(member.keys.hash)  # given back, not left to expire
            heard = listening.get_message(timeout=WOKEN)
            assert heard is not None and heard["data"] == b"0"  # Redisson's unlock message
        finally:
            listening.close()


def test_each_side_reenters_its_own_hold_and_keeps_the_other_out(
    redisson: Any, client: LockClient, java_thread: Any
) -> None:
    java = redisson().get_lock("order:44")
    lock = client.lock("order:44")
    with lock:
        with lock:
            assert lock.hold_count() == 2
            assert not java_thread(java.try_lock, 100).result()
        assert lock.locked() and not java_thread(java.try_lock, 100).result()
    assert java_thread(java.try_lock, 100).result()
    assert java_thread(java.try_lock, 100).result()  # a Java re-entry: count 2
    assert java_thread(java.get_hold_count).result() == 2
    java_thread(java.unlock).result()
    assert not lock.acquire(blocking=False)
    java_thread(java.unlock).result()
    assert lock.acquire(blocking=False)
    lock.release()


@pytest.mark.parametrize("flavour", ["publish", "spublish"])
def test_each_side_wakes_the_others_waiter_at_once(
    redisson: Any, redis_url: str, r: redis.Redis, java_thread: Any, flavour: str
) -> None:
    """A release wakes the other side's waiter by message, not by the 20 s lease running out."""
    if flavour == "spublish":
        skip_without_sharded_pubsub(r)
    jvm = redisson(publish_command=flavour)
    java = jvm.get_lock("job:7")
    mode = "on" if flavour == "spublish" else "auto"
    with LockClient(
        redis_url, layout="redisson", watchdog_timeout=3, sharded_subscription=mode
    ) as client:
        lock = client.lock("job:7")
        # Python holds, Java waits (tryLock(8 s wait, 20 s lease)).
        assert lock.acquire(lease=20)
        waiter = java_thread(java.try_lock, 8000, 20000)
        time.sleep(0.3)
        released = time.monotonic()
        lock.release()
        assert waiter.result(timeout=10)
        assert time.monotonic() - released < WOKEN
        # Java holds (its 20 s lease), Python waits.
        python_waiter = on_thread(lambda: take_and_release(lock))
        time.sleep(0.3)
        released = time.monotonic()
        java_thread(java.unlock).result()
        granted, at = python_waiter.result(timeout=10)
        assert granted and at - released < WOKEN
    # What Java heard on the channel: Redisson's UNLOCK_MESSAGE, never anything else.
    heard = {payload for _, channel, payload in jvm.pubsub.messages if channel == java.channel_name}
    assert heard == {b"0"}


def test_each_side_force_releases_the_others_hold_and_wakes_its_waiters(
    redisson: Any, redis_url: str, java_thread: Any
) -> None:
    holder, waiting = redisson(), redisson()
    with LockClient(redis_url, layout="redisson", watchdog_timeout=1.5) as client:
        lock = client.lock("batch:1")
        # Python force-releases a Java hold; a Java waiter (another instance) gets it.
        assert java_thread(holder.get_lock("batch:1").try_lock_once).result()
        java_waiter = on_thread(lambda: waiting.get_lock("batch:1").try_lock(8000, 20000))
        time.sleep(0.3)
        released = time.monotonic()
        assert lock.force_release()
        assert java_waiter.result(timeout=10) and time.monotonic() - released < WOKEN
        assert waiting.get_lock("batch:1").force_unlock()
        # Java force-unlocks a Python hold: the holder learns it lost it, a waiter gets it.
        lost = threading.Event()
        lock.on_lost(lambda _lock: lost.set())
        assert lock.acquire()
        python_waiter = on_thread(lambda: take_and_release(lock))
        time.sleep(0.3)
        released = time.monotonic()
        assert holder.get_lock("batch:1").force_unlock()
        granted, at = python_waiter.result(timeout=10)
        assert granted and at - released < WOKEN
        assert lost.wait(3)  # the next renewal (every 0.5 s) finds the field gone
        assert lock.lost
        with pytest.raises(LockLostError):
            lock.release()


def test_a_dead_java_holders_lock_expires_to_a_python_waiter(
    redisson: Any, redis_url: str, java_thread: Any
) -> None:
    jvm = redisson(watchdog=1.5)
    java = jvm.get_lock("report:9")
    assert java_thread(java.try_lock_once).result()
    with LockClient(redis_url, layout="redisson", watchdog_timeout=1.5) as client:
        lock = client.lock("report:9")
        # Java's watchdog keeps its own hold past the timeout; this side never renews it.
        assert not lock.acquire(timeout=2.0)
        assert jvm.renewal.locks.rounds >= 2
        jvm.shutdown()  # the JVM dies: nothing renews its hold any more
        died = time.monotonic()
        assert lock.acquire(timeout=5)
        # Woken by the key's expiry (within Java's 1.5 s timeout), not by its own
        # 5 s timeout; the rest is slack for a loaded machine.
        assert time.monotonic() - died <= 1.5 + 1.5
        lock.release()


def test_a_killed_python_holders_lock_expires_to_a_java_waiter(
    redisson: Any, redis_url: str, java_thread: Any
) -> None:
    java = redisson(watchdog=1.5).get_lock("report:10")
    with python_module("tests.interop.holder", redis_url, "report:10", "1.5") as holder:
        assert read_answer(holder)["token"] > 0
        # Its watchdog keeps the hold past the timeout; Java's never renews it.
        assert not java_thread(java.try_lock, 2000).result()
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        died = time.monotonic()
        assert java_thread(java.try_lock, 5000).result()
        assert time.monotonic() - died <= 1.5 + 1.5  # by the expiry, not the 5 s timeout
        java_thread(java.unlock).result()


def test_tokens_are_one_increasing_sequence_with_rfencedlock(
    redisson: Any, client: LockClient, r: redis.Redis
) -> None:
    java = redisson().get_fenced_lock("ledger")
    lock = client.lock("ledger")
    tokens = []
    for _ in range(3):
        tokens.append(java.try_lock_and_get_token(1000, 5000))
        java.unlock()
        with lock:
            token = lock.token
            with lock:  # a re-entry keeps its grant's token
                assert lock.token == token
            tokens.append(token)
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    # Redis loses the counter (FLUSHALL: a restart without persistence). Redisson's
    # own INCR restarts at 1; this side's next token stays above every earlier one.
    r.flushall()
    assert java.try_lock_and_get_token(1000, 5000) == 1
    java.unlock()
    with lock:
        after_loss = lock.token
    assert after_loss is not None and after_loss > max(tokens)
    assert java.try_lock_and_get_token(1000, 5000) == after_loss + 1  # Java follows on
    java.unlock()


def test_the_token_counter_expires_and_java_still_follows_every_python_token(
    redisson: Any, redis_url: str, r: redis.Redis
) -> None:
    """A name locked once no longer keeps Redisson's counter forever (issue 32).

    The counter expires with the lock; when it ran out during a long Python
    hold, the release sets it again, so Redisson's next INCR still continues
    above every token this side gave; and when it ran out while the name was
    unlocked, this side's clock floor keeps its tokens increasing.
    """
    java = redisson().get_fenced_lock("ledger:9")
    counter = "redisson_lock_token:{ledger:9}"
    with LockClient(redis_url, layout="redisson", watchdog_timeout=1.5) as client:
        lock = client.lock("ledger:9")
        with lock:
            first = lock.token
            assert 0 < r.pttl(counter) <= 1500
            time.sleep(2.0)  # renewed past the counter's first expiry
            assert not r.exists(counter) and not lock.lost
            with lock:  # a re-entry still reports its grant's token
                assert lock.token == first
        assert first is not None and int(r.get(counter) or 0) == first
        assert 0 < r.pttl(counter) <= 1500  # what was left of the lock's life
        assert java.try_lock_and_get_token(1000, 5000) == first + 1
        java.unlock()
        assert lock.acquire(lease=0.2)
        second = lock.token
        lock.release()
        time.sleep(0.5)
        assert not r.exists(counter)  # nothing is left of the name for ever
        with lock:
            assert second is not None and lock.token is not None and lock.token > second > first


def test_mixed_contention_never_overlaps_nor_loses_an_update(
    redisson: Any, client: LockClient
) -> None:
    """Threads on both sides increment a non-atomic counter under the one lock."""
    rounds, per_side = 20, 3  # 120 holds, as the issue measured
    state = {"counter": 0, "inside": 0, "overlaps": 0}
    guard = threading.Lock()  # counts who is inside; the counter itself is not guarded

    def critical() -> None:
        with guard:
            state["inside"] += 1
            state["overlaps"] += state["inside"] > 1
        value = state["counter"]
        time.sleep(0.002)  # a read-modify-write that any overlap would break
        state["counter"] = value + 1
        with guard:
            state["inside"] -= 1

    def python_side() -> None:
        lock = client.lock("counter")
        for _ in range(rounds):
            assert lock.acquire(timeout=20)
            try:
                critical()
            finally:
                lock.release()

    jvms = [redisson(), redisson()]

    def java_side(index: int) -> None:
        java = jvms[index % 2].get_lock("counter")
        for _ in range(rounds):
            java.lock()
            try:
                critical()
            finally:
                java.unlock()

    threads = [threading.Thread(target=python_side) for _ in range(per_side)]
    threads += [threading.Thread(target=java_side, args=(i,)) for i in range(per_side)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    assert state["overlaps"] == 0
    assert state["counter"] == 2 * per_side * rounds


def test_an_asyncio_lock_is_shared_the_same_way(
    redisson: Any, redis_url: str, java_thread: Any
) -> None:
    java = redisson().get_lock("async:1")

    def on_java(call: Callable[..., Any], *args: Any) -> Any:
        return asyncio.to_thread(lambda: java_thread(call, *args).result(10))

    async def main() -> None:
        async with AsyncLockClient(redis_url, layout="redisson", watchdog_timeout=3) as client:
            lock = client.lock("async:1")
            assert await lock.acquire(lease=20)
            assert await on_java(java.is_locked) and not await on_java(java.try_lock_once)
            waiter = java_thread(java.try_lock, 8000, 20000)
            await asyncio.sleep(0.3)
            released = time.monotonic()
            await lock.release()
            assert await asyncio.to_thread(waiter.result, 10)
            assert time.monotonic() - released < WOKEN
            # Java holds (the waiter's grant); an asyncio waiter is woken by its unlock.

            async def take_and_release() -> tuple[bool, float]:  # a task: its own owner
                granted = await lock.acquire(timeout=8)
                at = time.monotonic()
                if granted:
                    assert await lock.owned()
                    await lock.release()
                return granted, at

            waiting = asyncio.ensure_future(take_and_release())
            await asyncio.sleep(0.3)
            released = time.monotonic()
            await on_java(java.unlock)
            granted, at = await waiting
            assert granted and at - released < WOKEN
            assert not await lock.locked()

    asyncio.run(main())
