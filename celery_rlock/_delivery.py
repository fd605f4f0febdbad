"""One run per message: a task message delivered again is dropped, not run again.

A broker may hand one task message to the workers more than once: Redis gives
a message nobody acknowledged to another worker once its ``visibility_timeout``
has passed (an ``acks_late`` task running longer than that, an ETA or
countdown further away, a prefetched message left waiting), an
acknowledgement can be lost with its connection, and a producer can send the
same task id twice. So each delivery of a locked task is checked against the
runs of its task id, with what the run lock already knows (the holder
metadata of every grant names the task id of the run holding it, see
:mod:`django_rlock.core._process.holder`) and one record in the lock's hash slot::

    <lock hash>:done:<task id>   STRING   a run of this task id has ended

A delivery is a duplicate when

``finished``
    a run of its task id has ended (checked before the lock is taken, and
    again once it is held, so a run ending in between is seen too);
``running``
    a run of its task id holds the lock (with ``lock_permits``, a permit),
    and is alive. A hold found before the lock is taken may be a run that
    died with its worker and has not expired yet: this delivery is then the
    one copy of the message left (``reject_on_worker_lost`` requeues it at
    once), and must run. So it waits out the time that hold had left plus one
    watchdog renewal period (``watchdog_timeout / 3``; at most about 4/3 of
    the watchdog timeout) and looks again: a live run has renewed its hold
    meanwhile, a dead one's has expired. A hold taken after this delivery
    first looked (it finds the lock busy, or a permit of the same task id
    granted before its own) is a run that began meanwhile, alive: dropped at once.

A duplicate is acknowledged and dropped with Celery's ``Ignore``, which stores
no state: the result backend keeps the outcome of the run that counted. Each
drop is logged (WARNING on the task's logger), sent as
:data:`celery_rlock.signals.duplicate_dropped`, and counted in
``django_rlock_duplicates_total{alias,lock,found}`` in a Django project with
``RLOCK_METRICS``. It is never retried.

The done record is written before the lock is released, so no delivery can
slip in between the run's end and its record. A run whose message goes on
writes none: ended by ``self.retry()`` (or ``on_busy="retry"``), by a
requeueing ``Reject``, or by ``Ignore`` (``Task.replace`` sends the same task
id on, and a body raising ``Ignore`` keeps the task's state itself), or one
that sent its own task id on while it ran, however it then ended
(``self.retry(throw=False)`` sends the retry and returns it instead of
raising it: the run goes on to return or raise, and the retry is still the
message's next run). Neither does a run that dies with its worker, so
``acks_late`` with ``reject_on_worker_lost`` (or the visibility timeout) runs
the task again: at least once for crashes, at most once for duplicates.

Two limits follow. A run longer than the visibility timeout has its message
handed to another worker, and that copy is dropped while the run goes on: if
the run then dies, no copy is left to run it again (keep the visibility
timeout above the longest run, as Celery advises anyway). And a run that sends
its own task id on must end soon after (``raise self.retry()`` and
``Task.replace`` do; after ``self.retry(throw=False)``, the body's own rest):
one still holding the lock once the new message has waited it out gets that
message dropped as a duplicate.

Records expire after ``done_ttl`` seconds (the task's ``lock_done_ttl``; by
default :func:`default_done_ttl`, derived from the broker's visibility
timeout): a delivery later than that runs again. Calls outside a worker
(``task(...)``, eager ``apply()``) are no deliveries and are not checked.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias

from celery._state import get_current_task
from celery.exceptions import Ignore, Reject, Retry
from celery.signals import after_task_publish
from celery.utils.log import get_task_logger
from kombu.transport.redis import Channel as RedisChannel
from redis.exceptions import RedisError

from celery_rlock.signals import duplicate_dropped
from django_rlock._celeryface import AliasAttached, reporter_of
from django_rlock.core._faces import (
    UNREACHABLE,
    SemaphoreBase,
    escape,
    permit_prefix,
    stored_task_id,
    thread_owner,
)

if TYPE_CHECKING:
    import redis
    from celery import Celery

    from django_rlock.core import RLock

logger = get_task_logger("celery_rlock")

#: What made a delivery a duplicate (the ``found`` of the signal and the metric).
Found: TypeAlias = Literal["running", "finished"]

#: kombu's ``visibility_timeout`` of the Redis transport when
#: ``broker_transport_options`` sets none (one hour).
DEFAULT_VISIBILITY_TIMEOUT: Final = 3600.0

# kombu's Redis transport looks for overdue messages every
# ``unacked_restore_interval`` seconds, scanning on one call in
# ``unacked_restore_throttle``: every 100 s by default. Releases before kombu
# 5.7 have neither option: they look every 10 s and scan on one call in 10,
# whatever ``broker_transport_options`` says.
_DEFAULT_RESTORE_INTERVAL: Final = 10.0
_DEFAULT_RESTORE_THROTTLE: Final = 10.0
_RESTORE_OPTIONS: Final = ("unacked_restore_interval", "unacked_restore_throttle")

#: Seconds a restored message may wait in its queue before a worker takes it,
#: in the default ``done_ttl``. Queues that back up longer need a longer
#: ``lock_done_ttl``.
DONE_TTL_QUEUE_MARGIN: Final = 200.0

# KEYS[1] the done record, KEYS[2] the lock's hash (a semaphore's: its index
# of owners). ARGV[1] the task id, ARGV[2] a semaphore's permit key prefix (''
# for a lock), ARGV[3] 'look' (before the lock is taken, or when it is busy)
# or 'holding' (the caller holds it), ARGV[4] the caller's owner id when it
# holds a permit ('' otherwise), ARGV[5] how a hold of this task id begins
# its '~task' field (core/holder.py's stored_task_id: never cut).
# Returns {'finished'} when a run of the task id has ended; {'running', pttl}
# when another run of it holds the lock (pttl: that hold's PTTL in ms; a caller
# holding a permit counts only a permit granted before its own, ties going to
# the smaller owner id); else nil. The holders' descriptions ('~task', the
# task's part; '~since', the grant's server time: core/holder.py; a previous
# release's hold has its task id in the JSON of '~holder') are read from the
# hashes the index names, all in the lock's slot (as the semaphore's scripts do).
_CHECK: Final = """
if redis.call('exists', KEYS[1]) == 1 then
    return {'finished'}
end
local function of_this_task(hash)
    local task = redis.call('hget', hash, '~task')
    if task then
        return string.sub(task, 1, #ARGV[5]) == ARGV[5]
    end
    local raw = redis.call('hget', hash, '~holder')
    if not raw then
        return false
    end
    local ok, holder = pcall(cjson.decode, raw)
    return ok and type(holder) == 'table' and holder['task_id'] == ARGV[1]
end
if ARGV[2] == '' then
    if ARGV[3] == 'look' and of_this_task(KEYS[2]) then
        return {'running', redis.call('pttl', KEYS[2])}
    end
    return nil
end
local mine = nil
if ARGV[3] == 'holding' then
    mine = tonumber(redis.call('hget', ARGV[2] .. ARGV[4], '~since') or '0')
end
for _, owner in ipairs(redis.call('smembers', KEYS[2])) do
    local permit = ARGV[2] .. owner
    if owner ~= ARGV[4] and of_this_task(permit) then
        local earlier = true
        if mine then
            local since = tonumber(redis.call('hget', permit, '~since') or '0')
            earlier = since < mine or (since == mine and owner < ARGV[4])
        end
        if earlier then
            return {'running', redis.call('pttl', permit)}
        end
    end
end
return nil
"""

_FOUND_SAYS: Final[dict[str, str]] = {
    "running": "is running now",
    "finished": "has already run",
}


def default_done_ttl(app: Celery) -> float:
    """The default ``done_ttl`` of ``app``'s tasks: how late a redelivery can come.

    The broker's ``visibility_timeout`` (``broker_transport_options``; kombu's
    one hour when unset), plus the time kombu may take to notice the message
    is overdue (``unacked_restore_interval`` x ``unacked_restore_throttle``,
    100 s by default), plus :data:`DONE_TTL_QUEUE_MARGIN` for the restored
    copy's wait in its queue: 3900 s with the defaults. The two restore
    options count only with a kombu that reads them (5.7 and later); an
    older one always takes 100 s.
    """
    options = app.conf.broker_transport_options or {}
    if not _restore_options_read():
        options = {k: v for k, v in options.items() if k not in _RESTORE_OPTIONS}
    visibility = _seconds(options.get("visibility_timeout"), DEFAULT_VISIBILITY_TIMEOUT)
    interval = _seconds(options.get("unacked_restore_interval"), _DEFAULT_RESTORE_INTERVAL)
    throttle = _seconds(options.get("unacked_restore_throttle"), _DEFAULT_RESTORE_THROTTLE)
    return visibility + interval * max(throttle, 1.0) + DONE_TTL_QUEUE_MARGIN


def _restore_options_read() -> bool:
    """Whether the installed kombu's Redis transport reads the restore options."""
    known = getattr(RedisChannel, "from_transport_options", ())
    return all(option in known for option in _RESTORE_OPTIONS)


def _seconds(value: object, default: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return default
    return max(float(value), 0.0)


@dataclass(eq=False)
class Delivery:
    """One delivery of a locked task's message, checked against the runs of its task id."""

    lock: RLock
    task: Any
    #: The run's request; None for a call that is no delivery (checks and records nothing).
    request: Any
    #: Seconds the done record lives.
    ttl: float

    @classmethod
    def of(
        cls, task: Any, request: Any, lock: RLock, done_ttl: float | None, *, app: Celery
    ) -> Delivery:
        """The delivery of the run of ``task`` (of ``app``) whose request is ``request``.

        ``done_ttl`` is the task's ``lock_done_ttl`` (None: :func:`default_done_ttl`).

        A direct call (``task(...)``, or no task at all) or an eager one
        (``apply()``, ``task_always_eager``) is no delivery: what this returns
        then checks and records nothing.
        """
        if (
            task is None
            or request is None
            or request.called_directly
            or request.is_eager
            or not request.id
        ):
            return cls(lock=lock, task=task, request=None, ttl=0.0)
        ttl = done_ttl
        if ttl is None:
            ttl = default_done_ttl(app)
        return cls(lock=lock, task=task, request=request, ttl=ttl)

    @property
    def task_id(self) -> str:
        """The task id of the message delivered."""
        task_id: str = self.request.id
        return task_id

    @property
    def done_key(self) -> str:
        """The record of a run of this task id that has ended."""
        return f"{self.lock.keys.hash}:done:{escape(self.task_id)}"

    def before_acquire(self) -> None:
        """Before the lock is taken: drop a duplicate (raise ``Ignore``).

        A run of this task id holding the lock is waited out first (its hold's
        time left plus one renewal period, see the module's docstring): it is
        alive if it still holds the lock then.
        """
        found, left = self._look()
        if found == "running":
            time.sleep(left + self.lock.client.watchdog_timeout / 3)
            found, _ = self._look()
        if found is not None:
            raise self.dropped(found)

    def when_busy(self) -> None:
        """The lock stayed busy: drop this delivery (``Ignore``) if a run of its id holds it."""
        found, _ = self._look()
        if found is not None:
            raise self.dropped(found)

    def once_acquired(self, release: Callable[[], object]) -> None:
        """The lock is held: if a run of this task id ended meanwhile, ``release()`` and drop."""
        found, _ = self._look(holding=True)
        if found is not None:
            release()
            raise self.dropped(found)

    def dropped(self, found: Found) -> Ignore:
        """Report this duplicate (log, signal, metric); raise what this returns."""
        logger.warning(
            "task %s[%s] %s under lock %r: this delivery is a duplicate, dropped",
            self.task.name,
            self.task_id,
            _FOUND_SAYS[found],
            self.lock.name,
        )
        duplicate_dropped.send(
            sender=self.task,
            task_id=self.task_id,
            lock=self.lock.name,
            found=found,
            request=self.request,
        )
        reporter = reporter_of(self.lock.backend) if isinstance(self.lock, AliasAttached) else None
        if reporter is not None and reporter.metrics is not None:
            reporter.metrics.count_duplicate(self.lock, found)
        return Ignore(f"duplicate delivery of task {self.task_id}: its run {_FOUND_SAYS[found]}")

    def finish(self, ending: BaseException | None) -> None:
        """Record that the run ended with ``ending`` (None: it returned).

        Called while the run still holds its lock, just before it releases it,
        so it never raises. No record for a run whose
        message goes on (see the module's docstring), nor for one interrupted
        by ``SystemExit`` / ``KeyboardInterrupt`` (a worker going down: Celery
        treats that run as lost, not finished).
        """
        if self.request is None or _message_goes_on(self.request, ending):
            return
        try:
            self._redis.set(self.done_key, "1", px=max(1, math.ceil(self.ttl * 1000)))
        except RedisError as error:  # never in place of the release that follows
            logger.error(
                "task %s[%s]: could not record its end under lock %r (%r): a redelivery "
                "of its message would run it again",
                self.task.name,
                self.task_id,
                self.lock.name,
                error,
            )

    def _look(self, *, holding: bool = False) -> tuple[Found | None, float]:
        """What makes this delivery a duplicate, and the running hold's seconds left.

        A lock server that cannot be reached answers (None, 0): the lock's own
        calls then meet the outage (``on_unavailable``), and a run that does go
        ahead is the at-least-once side of the rule.
        """
        if self.request is None:
            return None, 0.0
        semaphore = isinstance(self.lock, SemaphoreBase)
        try:
            reply = self._redis.register_script(_CHECK)(
                keys=[self.done_key, self.lock.keys.hash],
                args=[
                    self.task_id,
                    permit_prefix(self.lock.keys) if semaphore else "",
                    "holding" if holding else "look",
                    thread_owner() if semaphore and holding else "",
                    stored_task_id(self.task_id),
                ],
            )
        except UNREACHABLE as error:
            logger.warning(
                "task %s[%s]: could not look for an earlier delivery under lock %r (%r)",
                self.task.name,
                self.task_id,
                self.lock.name,
                error,
            )
            return None, 0.0
        if not reply:
            return None, 0.0
        found = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        if found == "finished":
            return "finished", 0.0
        pttl = int(reply[1])
        if pttl == -1:  # a key with no expiry (written by hand): give it one timeout
            return "running", self.lock.client.watchdog_timeout
        return "running", max(pttl, 0) / 1000

    @property
    def _redis(self) -> redis.Redis:
        client: redis.Redis = self.lock.client.redis
        return client


#: The attribute a run's request gets once the run has sent its own task id on.
_SENT_ON: Final = "rlock_sent_on"


def sent_on(request: Any) -> bool:
    """Whether the run of ``request`` has sent a message of its own task id on.

    ``self.retry()`` does, with or without ``throw=False``; see :func:`_note_sent_on`.
    """
    return request is not None and bool(getattr(request, _SENT_ON, False))


def _message_goes_on(request: Any, ending: BaseException | None) -> bool:
    """Whether the run of ``request`` that ended with ``ending`` leaves its task id to run on.

    It does when it sent its own message on while it ran, whatever it then
    returned or raised: that message is the task id's next run.
    """
    if sent_on(request):
        return True
    if ending is None:
        return False
    if isinstance(ending, Retry | Ignore):
        return True
    if isinstance(ending, Reject):
        return bool(ending.requeue)
    return not isinstance(ending, Exception)


def _note_sent_on(sender: Any = None, body: Any = None, headers: Any = None, **rest: Any) -> None:
    """Mark the running task's request when a message of its own task id was just published.

    ``self.retry()`` sends the retry through ``apply_async`` on the run's own
    thread, before it raises (or, with ``throw=False``, returns) ``Retry``:
    the run's request is on top of this thread's stack then. So is any other
    way a run sends its own task id on.
    """
    task = get_current_task()
    request = None if task is None else task.request_stack.top
    if request is None or request.called_directly or not request.id:
        return
    # Protocol 2 carries the id in the headers, protocol 1 in the body.
    sent_id = (headers or {}).get("id")
    if sent_id is None and isinstance(body, dict):
        sent_id = body.get("id")
    if sent_id == request.id:
        setattr(request, _SENT_ON, True)


after_task_publish.connect(_note_sent_on, weak=False)
