"""The elected beat: real ``celery beat`` processes on ElectedScheduler, a real worker, real Redis.

Two beats run the app of tests/celery/beat_app.py (a 1 s schedule, a 1.5 s
watchdog timeout); the worker records every run it gets with the slot and
term headers the leading beat sent it with. Each scenario checks the same
invariants on that record (:func:`check_history`): no slot sent twice, slots
in order, and the terms one after another (a beat's sends never interleave
with another's). Bounds on time are generous; the measured failover is printed
(``FIGURES``) for docs/beat.md.

The last tests need no process: the settings' errors, the slot arithmetic, and
a deposed leader's claim, on a scheduler in this process.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest
import redis
from celery import Celery
from celery.beat import ScheduleEntry, Scheduler
from celery.schedules import crontab, schedule

from celery_rlock import ConfigurationError
from celery_rlock.beat import ElectedScheduler, scheduled_at
from django_rlock.core import LockClient
from django_rlock.core._process.holder import DESCRIPTION_FIELDS, read_hold
from tests.celery.beat_app import INTERVAL, KEY_PREFIX, QUEUE
from tests.celery.beats import CeleryProcess, beat, worker
from tests.faults.proxy import FaultProxy
from tests.servers import RedisServer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

#: The beats' watchdog timeout: a dead leader's lock is gone within it.
WATCHDOG = 1.5

#: The longest a failover may take: the watchdog timeout plus two intervals
#: (measured: the lock's life left at the kill, at most the timeout, plus ~15 ms).
FAILOVER_BOUND = WATCHDOG + 2 * INTERVAL

#: The longest any wait below may take (only reached when something is broken).
WAIT = 30.0


@pytest.fixture(scope="module")
def beat_url(redis_server: RedisServer) -> str:
    """Database 2 of the session's server: the beats' broker and lock server."""
    return redis_server.url.rsplit("/", 1)[0] + "/2"


@pytest.fixture(scope="module")
def beat_worker(beat_url: str) -> Iterator[CeleryProcess]:
    """The one worker of this module: it runs every beat's sends."""
    with worker({"RLOCK_BEAT_BROKER_URL": beat_url}, QUEUE) as running:
        running.wait_for_output("ready.")
        yield running


@pytest.fixture
def store(beat_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(beat_url)
    yield client
    client.close()


@pytest.fixture
def run(beat_url: str, beat_worker: CeleryProcess) -> str:
    """A fresh run id: its own lock, schedule argument and record."""
    return uuid.uuid4().hex[:10]


def env_of(beat_url: str, run: str, **extra: str) -> dict[str, str]:
    return {
        "RLOCK_BEAT_BROKER_URL": beat_url,
        "RLOCK_BEAT_LOCK_URL": beat_url,
        "RLOCK_BEAT_RUN": run,
        "RLOCK_BEAT_WATCHDOG": str(WATCHDOG),
        **extra,
    }


def lock_key(run: str) -> str:
    return f"{KEY_PREFIX}:{{beat:{run}}}"


def sends(store: redis.Redis, run: str) -> list[dict[str, Any]]:
    """What the worker ran so far, in the order it ran it."""
    return [json.loads(raw) for raw in store.lrange(f"{KEY_PREFIX}:sends:{run}", 0, -1)]


def wait_until(condition: Callable[[], object], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.05)


def leader_pid(store: redis.Redis, run: str) -> int | None:
    hold = read_hold(*store.hmget(lock_key(run), DESCRIPTION_FIELDS))
    return None if hold is None else int(hold["pid"])


def wait_sends(store: redis.Redis, run: str, count: int, token: int | None = None) -> None:
    """Until ``count`` runs were sent (by the term ``token``, when given)."""
    wait_until(
        lambda: len([s for s in sends(store, run) if token in (None, s["token"])]) >= count,
        f"{count} sends" + ("" if token is None else f" of term {token}"),
    )


def slot_of(send: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(send["slot"])


def check_history(history: list[dict[str, Any]]) -> list[int]:
    """No slot twice, terms one after another in slot order; the terms, in order."""
    slots = [slot_of(send) for send in history]
    assert len(set(slots)) == len(slots), "a slot was sent twice"
    by_slot = sorted(history, key=slot_of)
    tokens = [send["token"] for send in by_slot]
    assert tokens == sorted(tokens), "two beats' sends interleave"
    gaps = [later - earlier for earlier, later in itertools.pairwise(slots)]
    assert all(gap > timedelta(0) for gap in gaps), "slots out of order"
    return sorted(set(tokens))


def check_left_behind(store: redis.Redis, run: str) -> None:
    """After every beat stopped: no lock, no waiter, no subscriber; the records expire.

    The request latches of the core (``<lock>:req``, lost-reply protection)
    live their own 60 s and are not waited for here.
    """
    key = lock_key(run)
    assert not store.exists(key) and not store.exists(f"{key}:waiters")
    assert store.pubsub_numsub(f"{key}:released")[0][1] == 0

    def others() -> list[bytes]:
        return [k for k in store.scan_iter(match=f"{key}*") if not k.endswith(b":req")]

    # An entry's record lives an interval and two watchdog timeouts past its send.
    wait_until(lambda: not others(), "the beat's keys to expire", INTERVAL + 2 * WATCHDOG + 3)
    assert all(0 < store.pttl(k) <= 60_000 for k in store.scan_iter(match=f"{key}*"))


def test_a_killed_leader_is_replaced_within_the_watchdog_timeout(
    store: redis.Redis, beat_url: str, run: str
) -> None:
    env = env_of(beat_url, run)
    with beat(env) as first, beat(env) as second:
        wait_until(lambda: leader_pid(store, run) in (first.pid, second.pid), "a leader")
        leader, standby = (
            (first, second) if leader_pid(store, run) == first.pid else (second, first)
        )
        wait_sends(store, run, 2)
        leader.kill()
        killed_at = time.time()
        old = {send["token"] for send in sends(store, run)}
        wait_until(
            lambda: len([s for s in sends(store, run) if s["token"] not in old]) >= 2,
            "two sends of the standby",
        )
        assert leader_pid(store, run) == standby.pid
        assert standby.stop() == 0
    history = sends(store, run)
    terms = check_history(history)
    assert len(terms) == 2
    before = [send for send in history if send["token"] == terms[0]]
    after = [send for send in history if send["token"] == terms[1]]
    takeover = min(send["ran_at"] for send in after) - killed_at
    # The standby goes on from the leader's last sent slot, from Redis (its own
    # schedule file never saw it): the next slot, or the one after when the
    # leader died between claiming a slot and sending it.
    step = slot_of(after[0]) - max(slot_of(send) for send in before)
    print(f"FIGURES beat SIGKILL: next send {takeover:.2f}s after the kill; slot step {step}")
    assert takeover <= FAILOVER_BOUND
    assert step in (timedelta(seconds=INTERVAL), timedelta(seconds=2 * INTERVAL))
    check_left_behind(store, run)


@pytest.mark.faults
def test_a_leader_cut_off_from_redis_steps_down_without_crashing(
    store: redis.Redis, beat_url: str, run: str, redis_server: RedisServer
) -> None:
    with FaultProxy(redis_server.port) as proxy:
        # Only the lock server is behind the proxy: the broker stays reachable.
        cut_url = f"redis://127.0.0.1:{proxy.port}/2?socket_timeout=1"
        with beat(env_of(beat_url, run, RLOCK_BEAT_LOCK_URL=cut_url)) as cut:
            wait_until(lambda: leader_pid(store, run) == cut.pid, "the first beat to lead")
            with beat(env_of(beat_url, run)) as other:
                other.wait_for_output("beat: Starting...")
                wait_sends(store, run, 2)
                proxy.blackhole()
                cut_at = time.time()
                old = {send["token"] for send in sends(store, run)}
                wait_until(
                    lambda: len([s for s in sends(store, run) if s["token"] not in old]) >= 2,
                    "two sends of the other beat",
                )
                assert leader_pid(store, run) == other.pid
                cut.wait_for_output("stepped down as leader")
                assert cut.alive()
                proxy.heal()  # the cut beat stands by again, and sends nothing
                wait_sends(store, run, len(sends(store, run)) + 2)
                assert cut.stop() == 0
                assert other.stop() == 0
    history = sends(store, run)
    terms = check_history(history)
    assert len(terms) == 2
    takeover = min(s["ran_at"] for s in history if s["token"] == terms[1]) - cut_at
    print(f"FIGURES beat partition: next send {takeover:.2f}s after the leader was cut off")
    assert takeover <= FAILOVER_BOUND
    assert "was lost" in cut.output()
    check_left_behind(store, run)


def test_database_scheduler_hands_over_on_sigterm_with_no_gap_and_no_double(
    store: redis.Redis, beat_url: str, run: str, tmp_path: Path
) -> None:
    # Installed beside the wheel only where a release supports the line's Django
    # (noxfile.beat_schedulers_for: none supports Django 6.1 yet).
    pytest.importorskip("django_celery_beat", reason="no django-celery-beat for this Django")
    django_env = {
        "DJANGO_SETTINGS_MODULE": "tests.celery.beat_settings",
        "RLOCK_BEAT_DB": str(tmp_path / "beat.sqlite3"),
        "RLOCK_BEAT_REDIS_URL": beat_url,
        "RLOCK_BEAT_SCHEDULER": "django_celery_beat.schedulers:DatabaseScheduler",
        "RLOCK_BEAT_LOCK_URL": "",  # the lock server is RLOCKS["default"]
    }
    env = env_of(beat_url, run, **django_env)
    migrate = [sys.executable, "-m", "django", "migrate", "--verbosity=0"]
    subprocess.run(
        migrate, cwd=ROOT, env={**os.environ, **env, "PYTHONPATH": str(ROOT)}, check=True
    )
    with beat(env) as first:
        wait_until(lambda: leader_pid(store, run) == first.pid, "the first beat to lead")
        with beat(env) as second:
            second.wait_for_output("beat: Starting...")
            wait_sends(store, run, 2)
            # The first term's token, read while it alone leads: read after the
            # handover, it could already hold the second term's (a loaded machine
            # let the second beat send before the test looked), never "new" again.
            old = {send["token"] for send in sends(store, run)}
            assert first.stop() == 0  # saves the schedule, releases the lock
            stopped_at = time.time()
            # Released, not left to expire: gone, or the standby's already (the first
            # beat's process has exited, so a hold it kept would still show its pid).
            assert leader_pid(store, run) in (None, second.pid)
            wait_until(lambda: leader_pid(store, run) == second.pid, "the second beat to lead")
            wait_until(
                lambda: len([s for s in sends(store, run) if s["token"] not in old]) >= 2,
                "two sends of the second beat",
            )
            assert second.stop() == 0
    history = sends(store, run)
    terms = check_history(history)
    assert len(terms) == 2
    before = [s for s in history if s["token"] == terms[0]]
    after = [s for s in history if s["token"] == terms[1]]
    # A clean handover: the next slot, no run skipped and none twice.
    assert slot_of(after[0]) - max(slot_of(s) for s in before) == timedelta(seconds=INTERVAL)
    takeover = min(s["ran_at"] for s in after) - stopped_at
    print(f"FIGURES beat SIGTERM (DatabaseScheduler): next send {takeover:.2f}s after the stop")
    # The hand-over itself is checked above (released at the stop) and by the slot
    # step; this only catches a hang: on a loaded host the new leader's start-up
    # (a DatabaseScheduler built afresh) alone took over 2 s.
    assert takeover <= FAILOVER_BOUND + WAIT / 3
    check_left_behind(store, run)


def test_a_standby_says_it_stands_by_who_leads_and_when_it_takes_over(
    store: redis.Redis, beat_url: str, run: str
) -> None:
    """A standby used to log only "beat: Starting..." until elected: it looked hung."""
    env = env_of(beat_url, run)
    with beat(env) as first:
        wait_until(lambda: leader_pid(store, run) == first.pid, "the first beat to lead")
        leader = f"{socket.gethostname()} pid {first.pid} thread 'MainThread (leader)'"
        with beat(env) as second:
            second.wait_for_output(f"beat: standing by: {leader} leads 'beat:{run}'")
            assert "elected leader" not in second.output()
            assert first.stop() == 0  # releases the lock: the standby takes over
            second.wait_for_output(f"elected leader of 'beat:{run}' (term ")
            assert f", taking over from {leader}: sending the schedule" in second.output()
            # Said once per leader, not at every wait (a wait lasts max_interval).
            assert second.output().count("beat: standing by:") == 1
            assert second.stop() == 0
    check_left_behind(store, run)


# -- in this process --------------------------------------------------------------------


def beat_app(**conf: object) -> Celery:
    app = Celery("elected", set_as_current=False)
    app.conf.update(broker_url="memory://", **conf)
    return app


@pytest.mark.pure
@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("rlock_beat_scheduler", "no.such.module:Scheduler", "cannot be imported"),
        ("rlock_beat_scheduler", "celery.beat:Service", "not a celery.beat.Scheduler subclass"),
        ("rlock_beat_scheduler", "celery_rlock.beat:ElectedScheduler", "names ElectedScheduler"),
        ("rlock_beat_scheduler", 42, "must name a beat scheduler class"),
        ("rlock_beat_lock", "", "rlock_beat_lock: lock name must not be empty"),
        ("rlock_beat_lock", 7, "rlock_beat_lock: lock name must be a str"),
    ],
)
def test_bad_beat_settings_are_refused_when_beat_starts(
    setting: str, value: object, message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ElectedScheduler(beat_app(**{setting: value}), lazy=True)


@pytest.mark.pure
def test_the_defaults_wrap_the_persistent_scheduler_under_the_celery_beat_lock() -> None:
    elected = ElectedScheduler(beat_app(), lazy=True)
    assert elected.wrapped.__name__ == "PersistentScheduler"
    assert elected.lock_name == "celery-beat"
    assert "wrapping celery.beat.PersistentScheduler" in elected.info
    assert elected.schedule == {} and not elected.should_sync()


@pytest.mark.pure
def test_a_slot_is_the_scheduled_time_whenever_it_is_computed() -> None:
    app = beat_app(timezone="UTC")
    last = datetime(2026, 1, 5, 10, 2, 30, 123000, tzinfo=UTC)
    every = ScheduleEntry("every", "t", last_run_at=last, schedule=schedule(7.5, app=app), app=app)
    assert scheduled_at(every) == last + timedelta(seconds=7.5)
    cron = ScheduleEntry(
        "cron", "t", last_run_at=last, schedule=crontab(minute="*/5", app=app), app=app
    )
    assert scheduled_at(cron) == datetime(2026, 1, 5, 10, 5, tzinfo=UTC)
    assert scheduled_at(cron) == scheduled_at(cron)  # whenever computed: the same instant


def test_a_deposed_leader_claims_nothing_before_it_hears_of_its_loss(
    redis_url: str, r: redis.Redis, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:10]
    app = beat_app(
        rlock_url=redis_url, rlock_key_prefix="btest", rlock_watchdog_timeout=30, timezone="UTC"
    )
    app.conf.beat_schedule = {"tick": {"task": "t", "schedule": 60.0}}
    app.conf.rlock_beat_lock = f"beat:{run}"
    elected = ElectedScheduler(app, schedule_filename=str(tmp_path / "schedule"), max_interval=1)
    entry = ScheduleEntry("tick", "t", schedule=schedule(60.0), app=app)
    try:
        assert elected.tick() > 0  # elected: the entry is not due for a minute
        assert elected.term is not None and elected.leading is not None
        first = elected.claim(entry)
        assert first is not None and first["rlock_beat_token"] == elected.term.token
        assert elected.claim(entry) is None  # the same slot, again
        # Another process takes the lock over; the watchdog (30 s) has not seen it yet.
        with LockClient(redis_url, key_prefix="btest") as other:
            assert other.lock(f"beat:{run}").force_release()
            taken = threading.Event()

            def lead_elsewhere() -> None:
                with other.leader(f"beat:{run}"):
                    taken.set()
                    stop.wait(WAIT)

            stop = threading.Event()
            thread = threading.Thread(target=lead_elsewhere)
            thread.start()
            assert taken.wait(WAIT)
            later = ScheduleEntry(
                "tick", "t", schedule=schedule(60.0), last_run_at=entry.last_run_at, app=app
            )
            later.last_run_at = entry.last_run_at + timedelta(seconds=60)
            assert not elected.term.lost
            assert elected.claim(later) is None  # refused by the server: not the holder
            stop.set()
            thread.join(WAIT)
    finally:
        elected.close()
    assert elected.term is None
    assert not r.exists(f"btest:{{beat:{run}}}")


class _SendsWhileStopped(Scheduler):  # type: ignore[misc]  # Celery's Scheduler is untyped
    """A beat scheduler whose send is where beat's SIGTERM lands: recorded if it completes."""

    sent: ClassVar[list[dict[str, Any]]] = []

    def apply_async(
        self, entry: ScheduleEntry, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> object:
        signal.raise_signal(signal.SIGTERM)  # beat is stopped while the message goes out
        type(self).sent.append(dict(entry.options["headers"]))
        return object()


def test_a_stop_between_a_slots_claim_and_its_send_waits_for_the_send(
    redis_url: str, r: redis.Redis, tmp_path: Path
) -> None:
    """Beat's SIGTERM handler raises SystemExit: it used to land after the claim, before the send.

    The slot was then recorded as sent, so the standby that took over went on
    from the next one: a run lost (the DatabaseScheduler hand-over test saw the
    next send two intervals after the last under load).
    """
    run = uuid.uuid4().hex[:10]
    app = beat_app(
        rlock_url=redis_url, rlock_key_prefix="btest", rlock_watchdog_timeout=30, timezone="UTC"
    )
    app.conf.beat_schedule = {"tick": {"task": "t", "schedule": 60.0}}
    app.conf.rlock_beat_lock = f"beat:{run}"
    app.conf.rlock_beat_scheduler = _SendsWhileStopped
    elected = ElectedScheduler(app, max_interval=1)

    def beats_handler(number: int, frame: object) -> None:  # celery.apps.beat's, in short
        raise SystemExit

    previous = signal.signal(signal.SIGTERM, beats_handler)
    _SendsWhileStopped.sent.clear()
    try:
        assert elected.tick() > 0  # elected: the entry is not due for a minute
        assert elected.term is not None and elected.leading is not None
        entry = elected.leading.schedule["tick"]
        with pytest.raises(SystemExit):
            elected.leading.apply_async(entry)
        # Claimed, then sent, then stopped; and the handler in place is beat's again.
        assert [sent["rlock_beat_token"] for sent in _SendsWhileStopped.sent] == [
            elected.term.token
        ]
        assert signal.getsignal(signal.SIGTERM) is beats_handler
    finally:
        signal.signal(signal.SIGTERM, previous)
        elected.close()
    assert not r.exists(f"btest:{{beat:{run}}}")
