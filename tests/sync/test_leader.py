"""Leader election (LockClient.leader, AsyncLockClient.leader) and re-election after a loss.

A term is lost here the way an operator or a partition loses it: the lock is
broken on the server (``force_release``, as ``manage.py rlock release`` does),
and the watchdog finds it at its next renewal (a third of the watchdog
timeout). Every wait is bounded generously; no test asserts a speed.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
import redis

from django_rlock.core import (
    InvalidLockNameError,
    LockClient,
    LockLostError,
    LockTimeout,
    Term,
)
from django_rlock.core._process.holder import DESCRIPTION_FIELDS, read_hold
from django_rlock.core.aio import AsyncLockClient

#: Short, so that a broken lock is noticed within a fraction of a second.
WATCHDOG_TIMEOUT = 1.5

#: The longest any event below may take (it takes a fraction of a second).
WAIT = 10.0


@pytest.fixture
def client(r: redis.Redis, redis_url: str) -> Iterator[LockClient]:
    with LockClient(redis_url, key_prefix="test", watchdog_timeout=WATCHDOG_TIMEOUT) as made:
        yield made


# -- re-election after a loss: the lock itself ------------------------------------


def test_a_new_grant_after_a_loss_is_a_fresh_hold_without_releasing_the_lost_one(
    client: LockClient,
) -> None:
    lock = client.lock("term")
    told = threading.Event()
    lock.on_lost(lambda _lock: told.set())
    assert lock.acquire()
    first = lock.token
    assert first is not None
    assert client.lock("term").force_release()
    assert told.wait(WAIT)
    assert lock.lost

    # Won again, the lost hold not released: a fresh hold, not lost, a higher token.
    assert lock.acquire(blocking=False)
    assert not lock.lost
    assert lock.token is not None and lock.token > first
    assert lock.hold_count() == 1  # on the server: the new hold only

    lock.release()  # the new hold
    assert not lock.locked()
    assert lock.lost  # the lost hold below it is the current one again...
    with pytest.raises(LockLostError):
        lock.release()  # ...until it is acknowledged
    assert lock.lost  # and the loss is remembered until the thread acquires again
    assert lock.acquire(blocking=False)
    assert not lock.lost
    lock.release()
    assert not lock.lost


def test_a_multilock_taken_again_after_a_loss_is_not_lost(client: LockClient) -> None:
    multi = client.multi_lock(client.lock("m1"), client.lock("m2"))
    told = threading.Event()
    multi.on_lost(lambda _lock: told.set())
    assert multi.acquire()
    assert client.lock("m2").force_release()
    assert told.wait(WAIT)
    assert multi.lost
    assert multi.acquire(blocking=False)  # m1 re-entered, m2 granted afresh
    assert not multi.lost
    multi.release()
    assert multi.lost  # the lost acquisition is the current one again
    with pytest.raises(LockLostError):
        multi.release()
    assert not client.lock("m1").locked() and not client.lock("m2").locked()


def test_the_asyncio_lock_gets_a_fresh_hold_after_a_loss_too(
    redis_url: str, r: redis.Redis
) -> None:
    async def scenario() -> None:
        async with AsyncLockClient(
            redis_url, key_prefix="test", watchdog_timeout=WATCHDOG_TIMEOUT
        ) as aclient:
            lock = aclient.lock("aterm")
            told = asyncio.Event()
            lock.on_lost(lambda _lock: told.set())
            assert await lock.acquire()
            first = lock.token
            assert first is not None
            assert await aclient.lock("aterm").force_release()
            await asyncio.wait_for(told.wait(), WAIT)
            assert lock.lost

            assert await lock.acquire(blocking=False)
            assert not lock.lost
            assert lock.token is not None and lock.token > first
            assert await lock.hold_count() == 1
            await lock.release()
            assert lock.lost
            with pytest.raises(LockLostError):
                await lock.release()
            assert lock.lost
            assert await lock.acquire(blocking=False)
            assert not lock.lost
            await lock.release()

    asyncio.run(scenario())
    assert not r.exists("test:{aterm}")


# -- LockClient.leader ----------------------------------------------------------------


class Candidate:
    """A thread standing for election ``name``: it leads until told to step down."""

    def __init__(self, client: LockClient, name: str, terms: list[tuple[str, int]]) -> None:
        self.client, self.name, self.terms = client, name, terms
        self.elected = threading.Event()
        self.step_down = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with self.client.leader("duty") as term:
            self.terms.append((self.name, term.token))
            self.elected.set()
            self.step_down.wait(WAIT)
            assert not term.lost
            self.terms.append((self.name, -term.token))  # stepped down (recorded before release)


def test_one_candidate_leads_at_a_time_and_each_term_has_a_higher_token(
    client: LockClient, r: redis.Redis
) -> None:
    terms: list[tuple[str, int]] = []
    first = Candidate(client, "first", terms)
    assert first.elected.wait(WAIT)
    second = Candidate(client, "second", terms)
    assert not second.elected.wait(0.3)  # standing by while the first leads
    first.step_down.set()
    assert second.elected.wait(WAIT)  # elected as the first steps down
    second.step_down.set()
    first.thread.join(WAIT)
    second.thread.join(WAIT)
    (_, t1), (_, end1), (_, t2), (_, end2) = terms
    assert [who for who, _ in terms] == ["first", "first", "second", "second"]
    assert (end1, end2) == (-t1, -t2) and t2 > t1
    assert not r.exists("test:{duty}")


def test_a_lost_term_is_told_and_left_quietly_and_the_next_term_is_fresh(
    client: LockClient, r: redis.Redis
) -> None:
    told: list[Term] = []
    told_event = threading.Event()

    def tell(lost: Term) -> None:
        told.append(lost)
        told_event.set()

    with client.leader("beat") as term:
        term.on_lost(tell)
        assert not term.lost and term.token >= 1
        holder = read_hold(*r.hmget("test:{beat}", DESCRIPTION_FIELDS)) or {}
        assert holder["thread"] == f"{threading.current_thread().name} (leader)"
        assert client.lock("beat").force_release()  # an operator breaks the lock
        assert told_event.wait(WAIT)
        assert told == [term] and term.lost
        late: list[Term] = []
        term.on_lost(late.append)  # registered after the loss: runs at once
        assert late == [term]
    # Leaving a lost term raised nothing; it stays lost.
    assert term.lost
    with client.leader("beat") as again:
        assert not again.lost and again.token > term.token
    assert not again.lost
    assert not r.exists("test:{beat}")


def test_a_candidate_not_elected_in_time_gets_lock_timeout(client: LockClient) -> None:
    held = client.lock("taken")
    assert held.acquire()
    outcome: list[BaseException] = []

    def stand() -> None:
        try:
            with client.leader("taken", timeout=0.2):
                pass
        except LockTimeout as error:
            outcome.append(error)

    thread = threading.Thread(target=stand)
    thread.start()
    thread.join(WAIT)
    held.release()
    assert len(outcome) == 1
    assert "not elected leader of 'taken' within 0.2s" in str(outcome[0])


@pytest.mark.parametrize(
    ("name", "timeout", "error"),
    [("", None, InvalidLockNameError), ("ok", -1, ValueError), ("ok", "soon", ValueError)],
)
def test_bad_election_arguments_are_refused_at_once(
    client: LockClient, name: str, timeout: object, error: type[Exception]
) -> None:
    with pytest.raises(error):
        client.leader(name, timeout=timeout)  # type: ignore[arg-type]


def test_an_exception_in_the_block_steps_down_and_propagates(
    client: LockClient, r: redis.Redis
) -> None:
    with pytest.raises(KeyError), client.leader("failing"):
        raise KeyError("boom")
    assert not r.exists("test:{failing}")


# -- AsyncLockClient.leader -------------------------------------------------------------


def test_asyncio_candidates_elect_one_leader_and_a_lost_term_is_told_on_the_loop(
    redis_url: str, r: redis.Redis
) -> None:
    async def scenario() -> list[str]:
        events: list[str] = []
        async with AsyncLockClient(
            redis_url, key_prefix="test", watchdog_timeout=WATCHDOG_TIMEOUT
        ) as aclient:
            election = aclient.leader("aduty")
            first_in = asyncio.Event()
            lost_told = asyncio.Event()

            async def told(term: Term) -> None:  # a coroutine callback runs as a task
                events.append(f"told {term.token}")
                lost_told.set()

            async def first() -> int:
                async with election as term:
                    events.append("first leads")
                    term.on_lost(told)
                    first_in.set()
                    await asyncio.wait_for(lost_told.wait(), WAIT)
                    assert term.lost
                    events.append("first steps down")
                return term.token

            async def second() -> int:
                await first_in.wait()
                async with election as term:
                    events.append("second leads")
                    assert not term.lost
                    return term.token

            leading = asyncio.ensure_future(first())
            standing = asyncio.ensure_future(second())
            await first_in.wait()
            await asyncio.sleep(0.2)
            assert "second leads" not in events
            assert await aclient.lock("aduty").force_release()
            first_token = await asyncio.wait_for(leading, WAIT)
            second_token = await asyncio.wait_for(standing, WAIT)
            assert second_token > first_token
            events.append(f"tokens {first_token} < {second_token}")
        return events

    events = asyncio.run(scenario())
    # A broken lock goes to the standby at once; the old leader hears of it at the
    # watchdog's next renewal, hence the fencing token (docs/beat.md).
    assert events[0] == "first leads"
    assert {"second leads", "first steps down"} <= set(events)
    told = [event for event in events if event.startswith("told ")]
    assert len(told) == 1 and events.index(told[0]) < events.index("first steps down")
    assert not r.exists("test:{aduty}")
