"""The Celery app of the tests: run by real worker processes and used to send tasks.

A worker imports it with ``celery -A tests.celery.app worker`` and reads its
server from the environment (:func:`configure_from_env`); the test process
calls :func:`configure` itself. Tasks record what they did in Redis:

``ctest:started:<run>``    LIST  one JSON line per run that got its lock
``ctest:intervals:<run>``  LIST  "start stop" (Redis server time) per finished run
``ctest:gate:<run>``       LIST  a run with ``gate=True`` waits here for a token
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery, Task
from celery.signals import task_postrun, worker_process_init
from django.conf import settings

from celery_rlock import LockedTask, locked
from celery_rlock._conf import get_lock
from django_rlock import locked as django_locked
from django_rlock.signals import lock_acquired, lock_lost, lock_released

app = Celery("rlock_tests", set_as_current=False)

#: Seconds a run waits on its gate before giving up (hang protection only).
GATE_TIMEOUT = 30


def configure(
    url: str,
    *,
    watchdog_timeout: float = 1.0,
    rlock_url: str | None = None,
    key_prefix: str = "ctest",
) -> None:
    """Point the app at the test Redis (broker, results and locks)."""
    app.conf.update(
        broker_url=url,
        result_backend=url,
        rlock_watchdog_timeout=watchdog_timeout,
        rlock_key_prefix=key_prefix,
        worker_prefetch_multiplier=1,
        result_expires=600,
        broker_connection_retry_on_startup=True,
        task_default_retry_delay=0.2,
    )
    if rlock_url is not None:
        app.conf.rlock_url = rlock_url


def configure_from_env() -> None:
    url = os.environ.get("RLOCK_TEST_BROKER_URL")
    if url is None:
        return
    configure(
        url,
        watchdog_timeout=float(os.environ.get("RLOCK_TEST_WATCHDOG_TIMEOUT", "1")),
        rlock_url=os.environ.get("RLOCK_TEST_RLOCK_URL"),
    )


configure_from_env()

_redis: dict[str, redis.Redis] = {}


def store() -> redis.Redis:
    """A plain client of the test server, one per process (rebuilt after fork)."""
    key = f"{os.getpid()}"
    client = _redis.get(key)
    if client is None:
        # Longer than the gate's BLPOP (redis-py 8's default socket timeout is 5 s).
        client = _redis[key] = redis.Redis.from_url(
            app.conf.broker_url, socket_timeout=GATE_TIMEOUT + 30
        )
    return client


def server_time() -> float:
    seconds, microseconds = store().time()
    return seconds + microseconds / 1e6


def work(task: Task, run: str, hold: float, gate: bool) -> dict[str, Any]:
    """The body of every recording task: announce, hold, record the interval."""
    start = server_time()
    rlock = getattr(task.request, "rlock", None)
    started = {
        "pid": os.getpid(),
        "id": task.request.id,
        "retries": task.request.retries,
        "token": None if rlock is None else rlock.token,
        "hold_count": None if rlock is None else rlock.lock.hold_count(),
    }
    store().rpush(f"ctest:started:{run}", json.dumps(started))
    if gate:
        if store().blpop([f"ctest:gate:{run}"], timeout=GATE_TIMEOUT) is None:
            raise RuntimeError("gate never opened")
    else:
        time.sleep(hold)
    store().rpush(f"ctest:intervals:{run}", f"{start} {server_time()}")
    return started


# -- the same body under each on_busy ---------------------------------------------------


@app.task(bind=True, base=LockedTask, lock="crit:{run}", on_busy="retry", max_retries=50)
def critical_retry(self: Task, run: str, hold: float = 0.0, gate: bool = False) -> Any:
    return work(self, run, hold, gate)


@app.task(bind=True, base=LockedTask, lock="crit:{run}", on_busy="skip")
def critical_skip(self: Task, run: str, hold: float = 0.0, gate: bool = False) -> Any:
    return work(self, run, hold, gate)


@app.task(bind=True, base=LockedTask, lock="crit:{run}", on_busy="wait", max_retries=50)
def critical_wait(self: Task, run: str, hold: float = 0.0, gate: bool = False) -> Any:
    return work(self, run, hold, gate)


@app.task(bind=True, base=LockedTask, lock="crit:{run}", on_busy="raise")
def critical_raise(self: Task, run: str, hold: float = 0.0, gate: bool = False) -> Any:
    return work(self, run, hold, gate)


@app.task(bind=True, max_retries=50)
@locked("crit:{run}", on_busy="wait")
def critical_decorated(self: Task, run: str, hold: float = 0.0, gate: bool = False) -> Any:
    return work(self, run, hold, gate)


@app.task(bind=True, max_retries=50)
@django_locked("crit:{run}")
def critical_django_decorated(self: Task, run: str, hold: float = 0.0, gate: bool = False) -> Any:
    """django_rlock's @locked under @app.task: the same as celery_rlock's (on_busy="retry")."""
    return work(self, run, hold, gate)


# -- lifecycle ---------------------------------------------------------------------------


@app.task(bind=True, base=LockedTask, lock="life:{run}", on_busy="raise")
def sleeper(self: Task, run: str, seconds: float) -> Any:
    """Holds its lock for ``seconds``; reports whether the hold was ever lost."""
    work(self, run, seconds, gate=False)
    return {"lost": self.request.rlock.lock.lost}


@app.task(bind=True, base=LockedTask, lock="retry:{run}", on_busy="raise", max_retries=3)
def retrying(self: Task, run: str) -> Any:
    """Retries itself once; each attempt records its token and hold count."""
    started = work(self, run, 0.0, gate=False)
    if self.request.retries == 0:
        raise self.retry(countdown=0.3)
    return started


# -- keys --------------------------------------------------------------------------------


@app.task(bind=True, base=LockedTask, lock="report:{customer_id}:{fmt}")
def report(self: Task, customer_id: int, fmt: str = "pdf") -> str:
    name: str = self.request.rlock.name
    return name


@app.task(bind=True)
@locked("order:{order_id}")
def charge(self: Task, order_id: int) -> str:
    name: str = self.request.rlock.name
    return name


# -- once --------------------------------------------------------------------------------


@app.task(bind=True, base=LockedTask, lock="once:{run}", once=True, on_busy="raise")
def once_task(self: Task, run: str, gate: bool = False, hold: float = 0.0) -> Any:
    return work(self, run, hold, gate)


@app.task(
    bind=True,
    base=LockedTask,
    lock="once:{run}",
    once=True,
    once_on_duplicate="return",
    on_busy="raise",
)
def once_returning(self: Task, run: str, gate: bool = False) -> Any:
    return work(self, run, 0.0, gate)


@app.task(bind=True, base=LockedTask, lock="once:{run}", once=True, max_retries=5)
def once_retry_returned(self: Task, run: str, countdown: float | None = None) -> Any:
    """With ``countdown``, sends its retry with ``throw=False`` and returns; it runs after that."""
    started = work(self, run, 0.0, gate=False)
    if self.request.retries == 0 and countdown is not None:
        self.retry(countdown=countdown, throw=False)
    return started


@app.task(base=LockedTask, lock="item:{payload[id]}")
def keyed(payload: dict[str, Any]) -> str:
    return "ran"


# -- a lock lost by the end of the run (tests/celery/test_lost.py) ------------------------


@app.task(bind=True, base=LockedTask, lock="lost:{run}", on_busy="raise")
def lost_returning(self: Task, run: str) -> str:
    work(self, run, 0.0, gate=True)
    return "the body's result"


@app.task(bind=True, base=LockedTask, lock="lost:{run}", on_busy="raise")
def lost_raising(self: Task, run: str) -> str:
    work(self, run, 0.0, gate=True)
    raise ValueError("the body's own error")


@app.task(bind=True, base=LockedTask, lock="lost:{run}", on_busy="raise", on_lost="fail")
def lost_failing(self: Task, run: str) -> str:
    work(self, run, 0.0, gate=True)
    return "the body's result"


@app.task(bind=True)
@locked("lost:{run}", on_busy="raise")
def lost_decorated(self: Task, run: str) -> str:
    work(self, run, 0.0, gate=True)
    return "the body's result"


@app.task(bind=True)
@locked("lost:{run}", on_busy="raise", on_lost="fail")
def lost_decorated_failing(self: Task, run: str) -> str:
    work(self, run, 0.0, gate=True)
    return "the body's result"


@task_postrun.connect
def record_lost_after_the_run(task: Any = None, args: Any = None, **kwargs: Any) -> None:
    """After a ``lost_*`` run: what its ``self.request.rlock.lost`` says."""
    if task is None or not task.name.rpartition(".")[2].startswith("lost_"):
        return
    rlock = getattr(task.request, "rlock", None)
    store().rpush(f"ctest:lost:{args[0]}", json.dumps(getattr(rlock, "lost", "missing")))


@worker_process_init.connect
def record_django_lock_signals(**kwargs: Any) -> None:
    """In a Django-configured worker, record django_rlock's signals in Redis."""
    if not settings.configured:
        return

    def acquired(name: str, waited: float, **rest: Any) -> None:
        store().rpush(f"ctest:signals:{name}", json.dumps(["acquired", waited]))

    def released(name: str, held: float, **rest: Any) -> None:
        store().rpush(f"ctest:signals:{name}", json.dumps(["released", held]))

    def lost(name: str, **rest: Any) -> None:
        store().rpush(f"ctest:signals:{name}", json.dumps(["lost", None]))

    lock_acquired.connect(acquired, weak=False)
    lock_released.connect(released, weak=False)
    lock_lost.connect(lost, weak=False)


# -- at most 3 runs per tenant (tests/celery/test_semaphore.py) --------------------------


@app.task(
    bind=True,
    base=LockedTask,
    lock="tenant:{run}",
    lock_permits=3,
    on_busy="retry",
    max_retries=200,
)
def tenant_call(self: Task, run: str, hold: float = 0.0, gate: bool = False) -> Any:
    """Holds one of the tenant's 3 permits while it runs."""
    return work(self, run, hold, gate)


# -- a task body that keeps its lock (tests/celery/test_leaks.py) ------------------------


@app.task(bind=True)
def leaky_body(self: Task, run: str) -> bool:
    """Takes lock ``leak:<run>`` (watchdog) and ends without releasing it."""
    from celery_rlock._conf import get_lock  # noqa: PLC0415 -- the worker's own lock source

    return get_lock(app, "default", f"leak:{run}").acquire(blocking=False)


@app.task(bind=True)
def reenter_probe(self: Task, run: str) -> dict[str, Any]:
    """The next task on the child: takes ``leak:<run>`` and gives it back, reporting how."""
    from celery_rlock._conf import get_lock  # noqa: PLC0415

    lock = get_lock(app, "default", f"leak:{run}")
    took = lock.acquire(blocking=False)
    seen = {"took": took, "hold_count": lock.hold_count() if took else 0}
    if took:
        lock.release()
    seen["locked_after_release"] = lock.locked()
    return seen


# -- once="queued", on_unavailable, lock_max_hold (issue 22) -----------------------------


@app.task(bind=True, base=LockedTask, lock="followup:{run}", once="queued", max_retries=100)
def once_queued(self: Task, run: str, gate: bool = False, again: bool = False) -> Any:
    """Dedup while queued only; with ``again``, enqueues itself once more from its body."""
    started = work(self, run, 0.0, gate)
    if again:
        started["next"] = once_queued.delay(run).id
    return started


#: Retried every second while the lock server is down (back-off capped at 1 s).
UNAVAILABLE_RETRY = {
    "max_retries": 30,
    "retry_backoff": 1,
    "retry_backoff_max": 1,
    "retry_jitter": False,
}


@app.task(bind=True, base=LockedTask, lock="unavailable:{run}", **UNAVAILABLE_RETRY)
def unavailable_retry(self: Task, run: str) -> Any:
    return work(self, run, 0.0, gate=False)


@app.task(bind=True, **UNAVAILABLE_RETRY)
@locked("unavailable:{run}")
def unavailable_decorated_retry(self: Task, run: str) -> Any:
    return work(self, run, 0.0, gate=False)


@app.task(
    bind=True, base=LockedTask, lock="unavailable:{run}", **{**UNAVAILABLE_RETRY, "max_retries": 1}
)
def unavailable_retried_once(self: Task, run: str) -> Any:
    return work(self, run, 0.0, gate=False)


@app.task(bind=True, base=LockedTask, lock="unavailable:{run}", on_unavailable="fail")
def unavailable_fail(self: Task, run: str) -> Any:
    return work(self, run, 0.0, gate=False)


@app.task(bind=True)
@locked("unavailable:{run}", on_unavailable="fail")
def unavailable_decorated_fail(self: Task, run: str) -> Any:
    return work(self, run, 0.0, gate=False)


@app.task(bind=True, base=LockedTask, lock="lost:{run}", on_busy="raise", lock_max_hold=1)
def lost_past_max_hold(self: Task, run: str, hold: float) -> bool:
    """Holds its lock ``hold`` seconds, past its max_hold of 1 s; was the hold lost by then?"""
    work(self, run, hold, gate=False)
    lost: bool = self.request.rlock.lost
    return lost


# -- one run per message (tests/celery/test_delivery.py) ---------------------------------
#
# ``ctest:runs:<run>`` counts the bodies that ran, ``ctest:deliveries:<run>`` the
# deliveries that reached the worker's child (task_prerun), ``ctest:dropped:<run>``
# one JSON line per delivery dropped as a duplicate. A worker started with
# ``RLOCK_TEST_VISIBILITY_TIMEOUT`` gives unacknowledged messages back after that
# many seconds, and looks for them every half of it.

from celery.signals import task_prerun  # noqa: E402 -- this section's own imports
from kombu.transport import redis as kombu_redis  # noqa: E402

from celery_rlock.signals import duplicate_dropped  # noqa: E402


def _backport_restore_options() -> None:
    """Teach a kombu before 5.7 the Redis transport's two restore options.

    kombu 5.7 added ``unacked_restore_interval`` and ``unacked_restore_throttle``;
    older releases (the oldest supported line, Celery 5.3, runs on one) ignore
    them, look for overdue messages every 10 s and scan on one look in 10: an
    unacknowledged message comes back up to 100 s late, after the tests' waits.
    The same two options, read as kombu 5.7 reads them, so the test workers
    sweep every half visibility timeout on every supported line (and
    ``default_done_ttl``, which counts these options only where kombu reads
    them, sees them read).
    """
    transport: Any = kombu_redis
    if "unacked_restore_interval" in transport.Channel.from_transport_options:
        return
    channel = transport.Channel
    channel.from_transport_options += ("unacked_restore_interval", "unacked_restore_throttle")
    channel.unacked_restore_interval = 10
    channel.unacked_restore_throttle = 10

    restore_visible = transport.QoS.restore_visible

    def throttled(qos: Any, start: int = 0, num: int = 10, interval: int | None = None) -> Any:
        if interval is None:
            interval = qos.channel.unacked_restore_throttle
        return restore_visible(qos, start, num, interval)

    register = transport.Transport.register_with_event_loop

    def register_with_event_loop(self: Any, connection: Any, loop: Any) -> None:
        register(self, connection, loop)  # its own look every 10 s stays
        interval = connection.client.transport_options.get("unacked_restore_interval", 10)
        loop.call_repeatedly(interval, self.cycle.maybe_restore_messages)

    transport.QoS.restore_visible = throttled
    transport.Transport.register_with_event_loop = register_with_event_loop


if os.environ.get("RLOCK_TEST_VISIBILITY_TIMEOUT"):
    _visibility = float(os.environ["RLOCK_TEST_VISIBILITY_TIMEOUT"])
    app.conf.broker_transport_options = {
        "visibility_timeout": _visibility,
        "unacked_restore_interval": _visibility / 2,
        "unacked_restore_throttle": 1,
    }
    _backport_restore_options()

DELIVERY_TASKS = (
    "delivered",
    "delivered_late",
    "delivered_retrying",
    "delivered_retry_returned",
    "delivered_retry_returned_decorated",
    "delivered_permit",
)


def counted_work(task: Task, run: str, hold: float, gate: bool) -> dict[str, Any]:
    store().incr(f"ctest:runs:{run}")
    return work(task, run, hold, gate)


@app.task(bind=True, base=LockedTask, lock="delivery:{run}", max_retries=50)
def delivered(self: Task, run: str, hold: float = 0.0, gate: bool = False) -> Any:
    """The default on_busy ("retry"), as the issue measured it."""
    return counted_work(self, run, hold, gate)


@app.task(
    bind=True,
    base=LockedTask,
    lock="delivery:{run}",
    acks_late=True,
    reject_on_worker_lost=True,
    max_retries=50,
)
def delivered_late(self: Task, run: str, hold: float = 0.0, gate: bool = False) -> Any:
    """Acknowledged after its run: redelivered past the visibility timeout, or when lost."""
    return counted_work(self, run, hold, gate)


@app.task(bind=True, base=LockedTask, lock="delivery:{run}", max_retries=5)
def delivered_retrying(self: Task, run: str) -> Any:
    """Sends its retry, holds its lock until the test opens the gate, then ends in Retry."""
    if self.request.retries == 0:
        retry = self.retry(countdown=0, throw=False)
        counted_work(self, run, 0.0, gate=True)
        raise retry
    return counted_work(self, run, 0.0, gate=False)


@app.task(bind=True, base=LockedTask, lock="delivery:{run}", max_retries=5)
def delivered_retry_returned(self: Task, run: str) -> Any:
    """Sends its retry with ``throw=False`` and returns: the run succeeds, the retry runs."""
    started = counted_work(self, run, 0.0, gate=False)
    if self.request.retries == 0:
        self.retry(countdown=1, throw=False)
    return started


@app.task(bind=True, max_retries=5)
@locked("delivery:{run}")
def delivered_retry_returned_decorated(self: Task, run: str) -> Any:
    """The same under celery_rlock's ``@locked`` on a plain task."""
    started = counted_work(self, run, 0.0, gate=False)
    if self.request.retries == 0:
        self.retry(countdown=1, throw=False)
    return started


@app.task(bind=True, base=LockedTask, lock="delivery:{run}", lock_permits=2, lock_done_ttl=30)
def delivered_permit(self: Task, run: str, hold: float = 0.0, gate: bool = False) -> Any:
    """Holds one of two permits; its task ids are remembered 30 s."""
    return counted_work(self, run, hold, gate)


def _delivery_run(task: Any, args: Any, kwargs: Any) -> str | None:
    if task is None or task.name.rpartition(".")[2] not in DELIVERY_TASKS:
        return None
    run = args[0] if args else (kwargs or {}).get("run")
    return run if isinstance(run, str) else None


@task_prerun.connect
def record_delivery(task: Any = None, args: Any = None, kwargs: Any = None, **rest: Any) -> None:
    run = _delivery_run(task, args, kwargs)
    if run is not None:
        store().rpush(f"ctest:deliveries:{run}", task.request.id)


@duplicate_dropped.connect
def record_dropped(sender: Any = None, request: Any = None, found: str = "", **rest: Any) -> None:
    run = _delivery_run(sender, request.args, request.kwargs)
    if run is not None:
        store().rpush(
            f"ctest:dropped:{run}",
            json.dumps({"id": request.id, "found": found, "retries": request.retries}),
        )


# -- rate limits -------------------------------------------------------------------------


@app.task(bind=True, base=LockedTask, lock_rate="4/s", lock_rate_key="rate:{run}", max_retries=5)
def rate_limited(self: Task, run: str) -> Any:
    """4 runs a second per ``run`` across the workers (burst 4); records each start."""
    return work(self, run, 0.0, gate=False)


@app.task(bind=True, base=LockedTask, lock="rate:{run}", lock_rate="1/m", max_retries=0)
def rate_limited_once(self: Task, run: str) -> Any:
    """One run a minute per ``run``, no retry: a second run fails at once."""
    return work(self, run, 0.0, gate=False)


# -- deadlocks -----------------------------------------------------------------------------


def transfer_body(task: Task, run: str, first: str, second: str) -> dict[str, Any]:
    """Holding the run's lock (``first``), meet the partner run, then take ``second``.

    Only the first attempt meets: a retried victim finds its partner done.
    """
    store().rpush(f"ctest:attempts:{run}", f"{first} {task.request.retries}")
    if task.request.retries == 0:
        store().rpush(f"ctest:meet:{run}:{first}", "here")
        if store().blpop([f"ctest:meet:{run}:{second}"], timeout=GATE_TIMEOUT) is None:
            raise RuntimeError("the partner run never came")
    with get_lock(app, "default", f"dl:{run}:{second}"):
        store().rpush(f"ctest:done:{run}", first)
    return {"first": first, "retries": task.request.retries}


@app.task(bind=True, base=LockedTask, lock="dl:{run}:{first}", max_retries=5)
def transfer_retry(self: Task, run: str, first: str, second: str) -> Any:
    """The default on_busy ("retry"): a deadlock's victim is re-queued."""
    return transfer_body(self, run, first, second)


@app.task(bind=True, base=LockedTask, lock="dl:{run}:{first}", on_busy="skip")
def transfer_skip(self: Task, run: str, first: str, second: str) -> Any:
    """on_busy="skip": a deadlock's victim is skipped."""
    return transfer_body(self, run, first, second)
