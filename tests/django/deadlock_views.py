"""Views that deadlock in pairs: each locks ``first``, meets its partner, then locks ``second``.

Two requests, ``/transfer/RUN/a/b/`` and ``/transfer/RUN/b/a/``, each hold
their first lock when they meet (a rendezvous in Redis, so the two may run in
different processes), then wait for the other's: a deadlock, which detection
breaks by failing one of them. ``?db=ALIAS`` records each step the request
took as a row of :data:`STEPS` on that database (under ``ATOMIC_REQUESTS``,
inside the request's transaction), so a test can tell what was committed.

``transfer`` takes both locks with ``with rlock(...)`` (the victim's
DeadlockError escapes to LockErrorMiddleware); ``transfer_locked`` takes its
second through an ``@locked`` function that receives the request (it answers
the DeadlockError itself).
"""

from __future__ import annotations

from django.db import connections
from django.http import HttpRequest, HttpResponse

from django_rlock import locked, locks, rlock
from django_rlock.backends.redis import RedisLockBackend

#: The table of steps: ``run`` (the test's), ``who`` (``first>second``), ``step`` (a lock).
STEPS = "rlock_deadlock_step"
#: Seconds a request waits for its partner at the rendezvous: only reached when something hangs.
MEET = 30


def meet(run: str, me: str, partner: str) -> None:
    """Wait until the partner request holds its first lock too (both announce, each waits)."""
    backend = locks["default"]
    assert isinstance(backend, RedisLockBackend)
    redis = backend.client.redis
    redis.rpush(f"meet:{run}:{me}", "here")
    assert redis.blpop([f"meet:{run}:{partner}"], timeout=MEET) is not None, "no partner came"


def record(request: HttpRequest, run: str, who: str, step: str) -> None:
    """A row saying request ``who`` of ``run`` took lock ``step`` (with ``?db=``)."""
    db = request.GET.get("db")
    if db is None:
        return
    with connections[db].cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {STEPS} (run, who, step) VALUES (%s, %s, %s)", [run, who, step]
        )


def transfer(request: HttpRequest, run: str, first: str, second: str) -> HttpResponse:
    who = f"{first}>{second}"
    with rlock("dl:{run}:{name}", run=run, name=first):
        record(request, run, who, first)
        meet(run, first, second)
        with rlock("dl:{run}:{name}", run=run, name=second):
            record(request, run, who, second)
    return HttpResponse("done")


def transfer_locked(request: HttpRequest, run: str, first: str, second: str) -> HttpResponse:
    who = f"{first}>{second}"
    with rlock("dl:{run}:{name}", run=run, name=first):
        record(request, run, who, first)
        meet(run, first, second)
        return second_step(request, run, second, who)


@locked("dl:{run}:{name}")
def second_step(request: HttpRequest, run: str, name: str, who: str) -> HttpResponse:
    record(request, run, who, name)
    return HttpResponse("done")
