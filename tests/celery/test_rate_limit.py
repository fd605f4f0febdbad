"""LockedTask's lock_rate on a real worker: a run over the limit retries exactly when due."""

from __future__ import annotations

import time

import pytest
import redis

from celery_rlock import LockedTask
from celery_rlock._ratelimit import RESERVED_HEADER
from django_rlock.core import LockTimeout
from tests.celery import app as test_app
from tests.celery.test_definition import define
from tests.celery.workers import Worker

#: The test task's rate: 4 a second, bursts of 4 (its lock_rate, "4/s").
INTERVAL, BURST = 0.25, 4

#: How late a retry may start after its permit is due (its message's ETA, the
#: worker picking it up): generous, as a busy machine may be slow.
LATE = 1.0


@pytest.mark.slow
def test_runs_over_the_limit_retry_once_exactly_when_their_permits_are_due(
    worker: Worker, store: redis.Redis, run: str
) -> None:
    sent = [test_app.rate_limited.delay(run) for _ in range(BURST + 4)]
    results = [result.get(timeout=30) for result in sent]
    # The burst runs at once; every other run was re-queued once, with the
    # countdown to its own permit: no ping-pong of retries.
    assert sorted(result["retries"] for result in results) == [0] * BURST + [1] * 4
    # Each run's start, by the server's clock (the limiter's).
    began = sorted(float(raw.split()[0]) for raw in store.lrange(f"ctest:intervals:{run}", 0, -1))
    assert len(began) == len(sent)
    first = began[0]
    late = [start - (first + index * INTERVAL) for index, start in enumerate(began[BURST:], 1)]
    print(f"\nretried runs started {', '.join(f'{s * 1000:+.0f}' for s in late)} ms from due")
    assert all(-0.05 <= lateness <= LATE for lateness in late), late
    log = worker.output()
    assert log.count(f"rate limit 4/s of 'rate:{run}' reached: retrying in") == 4
    assert f"rate limit 4/s of 'rate:{run}': the permit reserved for this run is due" in log


def test_a_run_with_no_retry_left_fails_naming_the_limit(
    worker: Worker, store: redis.Redis, run: str
) -> None:
    assert test_app.rate_limited_once.delay(run).get(timeout=20)["retries"] == 0
    with pytest.raises(LockTimeout, match=f"rate limit 1/m of 'rate:{run}' reached"):
        test_app.rate_limited_once.delay(run).get(timeout=20)
    assert store.llen(f"ctest:started:{run}") == 1


@pytest.mark.pure
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lock_rate": "0/s"}, "lock_rate must let at least 1 permit"),
        ({"lock_rate": "fast"}, "lock_rate must be 'N/s'"),
        ({"lock_rate": "5/s", "lock_rate_key": "pay:{order}"}, "has no parameter 'order'"),
        ({"lock_rate_key": "pay:{order_id}"}, "lock_rate_key needs a lock_rate"),
    ],
)
def test_bad_rate_options_fail_at_definition(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        define(**options)


@pytest.mark.pure
def test_the_rate_key_defaults_to_the_lock_template_then_the_task_name() -> None:
    from celery import Celery  # noqa: PLC0415 -- only these tests build apps

    app = Celery("rate-definition-test", set_as_current=False)

    @app.task(base=LockedTask, shared=False, lock="pay:{order_id}", lock_rate="5/s")  # type: ignore[untyped-decorator]
    def pay(order_id: int) -> None: ...

    @app.task(base=LockedTask, shared=False, name="odd{name}", lock_rate="5/s")  # type: ignore[untyped-decorator]
    def odd() -> None: ...

    assert pay.rate_options.key == "pay:{order_id}" and pay.rate_options.rate == "5/s"
    assert odd.rate_options.key.format() == "odd{name}"
    assert RESERVED_HEADER == "rlock_rate_reserved"


def test_a_direct_call_waits_for_its_permit_in_the_caller(broker_url: str, run: str) -> None:
    started = time.monotonic()
    for _ in range(BURST + 1):
        assert test_app.rate_limited(run)["retries"] == 0
    assert INTERVAL - 0.05 <= time.monotonic() - started <= INTERVAL + LATE
