"""Running one task call under its lock: shared by ``LockedTask`` and ``locked``.

The lock is taken when the run starts and released in a ``finally`` around the
task body, which Celery runs for every outcome: success, failure,
``self.retry()``, ``Ignore``, ``Reject`` and ``SoftTimeLimitExceeded``. (Celery
skips ``after_return`` on RETRY, IGNORED and REJECTED, so a release there leaks.)

Per-run state is a :class:`TaskLock` on ``self.request.rlock`` (the request is
per run; the task object is shared by every run in the process).

A delivery of a message whose task id has a live run holding the lock, or
one that has ended, is a duplicate: acknowledged and dropped, never run
again (:mod:`celery_rlock._delivery`).

A run whose lock wait is the victim of a deadlock
(:class:`~django_rlock.exceptions.DeadlockError`: its own lock's, or a lock
its body takes while holding the run's) is treated as a busy one, by
``on_busy``, once the body's holds are given back (see :func:`_deadlocked`):
re-queued by ``"retry"`` and ``"wait"``, skipped by ``"skip"``, failed by
``"raise"``.

A lock found lost when the run ends (its key expired, was force-released, or
vanished with a lock server that restarted) is reported, never allowed to
replace what the body returned or raised: a log line, ``rlock.lost`` turning
true and, in a Django project, the ``lock_lost`` signal. ``on_lost="fail"``
opts a task into failing with :class:`LockLostError` instead (only a body that
succeeded: its own exception always wins).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    Final,
    Literal,
    NoReturn,
    TypeAlias,
    TypedDict,
    TypeVar,
    get_args,
)

from celery.exceptions import Reject, Retry
from celery.utils.log import get_task_logger
from celery.utils.time import get_exponential_backoff_interval

from celery_rlock._conf import get_lock
from celery_rlock._delivery import Delivery, sent_on
from celery_rlock._once import OnceMarker
from django_rlock._celeryface import (
    MIN_RETRY_AFTER,
    UNAVAILABLE_RETRY_AFTER,
    AliasAttached,
    KeyTemplate,
    build_key,
    check_template,
    lock_retry_after,
    reporter_of,
    template_label,
)
from django_rlock.core._faces import (
    busy_reason,
    check_lease,
    check_max_hold,
    check_permits,
    check_timeout,
    holder_details,
)
from django_rlock.core.defaults import DEFAULT_LOCK_ALIAS
from django_rlock.core.exceptions import (
    DeadlockError,
    LockLostError,
    LockNotOwnedError,
    LockTimeout,
    LockUnavailableError,
)

if TYPE_CHECKING:
    from celery import Celery

    from django_rlock.core import RLock

logger = get_task_logger("celery_rlock")

#: What a run does when its lock stays busy; see the package docstring.
OnBusy: TypeAlias = Literal["retry", "skip", "wait", "raise"]

#: The default: a busy task goes back to the queue instead of holding a worker
#: slot while it waits, and nothing is dropped silently.
DEFAULT_ON_BUSY: Final[OnBusy] = "retry"

#: What a run does when its lock turns out lost at its end: ``"report"`` it
#: (log, ``rlock.lost``, the ``lock_lost`` signal) and keep the body's outcome,
#: or ``"fail"`` a run whose body succeeded with LockLostError.
OnLost: TypeAlias = Literal["report", "fail"]

#: The default: the work is done by then, and failing it would not undo an
#: overlap (a retry could even repeat the work); the report says one may have happened.
DEFAULT_ON_LOST: Final[OnLost] = "report"

#: What a run does when its lock server cannot be reached: re-queue the task
#: (Celery's back-off options and ``max_retries`` apply), or fail it.
OnUnavailable: TypeAlias = Literal["retry", "fail"]

#: The default: an outage is usually short, and a failed task is work dropped.
DEFAULT_ON_UNAVAILABLE: Final[OnUnavailable] = "retry"

_R = TypeVar("_R")

# Pauses between release attempts when Redis cannot be reached (seconds).
_RELEASE_RETRY_PAUSES: Final = (0.1, 0.3, 1.0)


class SkippedResult(TypedDict):
    """The result of a run skipped by ``on_busy="skip"``."""

    skipped: Literal[True]
    reason: str
    lock: str


@dataclass(frozen=True, slots=True)
class TaskLockOptions:
    """The lock options of one task, checked when the task is defined.

    Not the engine's ``LockOptions`` (a lock's ``with`` defaults, which this
    passes on in part): also the key, the alias and what a busy, lost or
    unreachable lock does to the run.
    """

    key: KeyTemplate
    timeout: float | None = None
    lease: float | None = None
    using: str = DEFAULT_LOCK_ALIAS
    on_busy: OnBusy = DEFAULT_ON_BUSY
    on_lost: OnLost = DEFAULT_ON_LOST
    #: Hold one permit of a semaphore of this many permits instead of the lock.
    permits: int | None = None
    #: Seconds a run's hold may last before the watchdog stops renewing it (None: no bound).
    max_hold: float | None = None
    #: Seconds a finished run's task id is remembered, so that a redelivery of
    #: the same message is dropped (None: from the broker's visibility timeout).
    done_ttl: float | None = None
    on_unavailable: OnUnavailable = DEFAULT_ON_UNAVAILABLE

    @classmethod
    def build(
        cls,
        key: object,
        func: Callable[..., Any],
        *,
        timeout: object = None,
        lease: object = None,
        using: object = DEFAULT_LOCK_ALIAS,
        on_busy: object = DEFAULT_ON_BUSY,
        on_lost: object = DEFAULT_ON_LOST,
        permits: object = None,
        max_hold: object = None,
        done_ttl: object = None,
        on_unavailable: object = DEFAULT_ON_UNAVAILABLE,
    ) -> TaskLockOptions:
        """Check every option against ``func`` (ValueError names the bad one)."""
        for option, value, choices in (
            ("on_busy", on_busy, get_args(OnBusy)),
            ("on_lost", on_lost, get_args(OnLost)),
            ("on_unavailable", on_unavailable, get_args(OnUnavailable)),
        ):
            if value not in choices:
                raise ValueError(f"{option} must be one of {choices}, got {value!r}")
        if not isinstance(using, str) or not using:
            raise ValueError(f"lock_using must be a lock alias (a non-empty str), got {using!r}")
        try:
            checked_timeout = check_timeout(timeout)
            checked_lease = check_lease(lease)
            checked_permits = None if permits is None else check_permits(permits)
            checked_max_hold = check_max_hold(max_hold)
            checked_done_ttl = None if done_ttl is None else _check_done_ttl(done_ttl)
        except ValueError as error:
            raise ValueError(f"lock_{error}") from None
        return cls(
            key=check_template(key, func),
            timeout=checked_timeout,
            lease=checked_lease,
            using=using,
            on_busy=on_busy,  # type: ignore[arg-type]  # checked against OnBusy above
            on_lost=on_lost,  # type: ignore[arg-type]  # checked against OnLost above
            permits=checked_permits,
            max_hold=checked_max_hold,
            done_ttl=checked_done_ttl,
            on_unavailable=on_unavailable,  # type: ignore[arg-type]  # checked above
        )

    @property
    def wait(self) -> float | None:
        """Seconds a run waits for the busy lock before ``on_busy`` applies.

        ``lock_timeout`` when set; else as long as it takes for ``"wait"``, and
        not at all for the other modes.
        """
        if self.timeout is not None:
            return self.timeout
        return None if self.on_busy == "wait" else 0.0


def _check_done_ttl(value: object) -> float:
    """``done_ttl``: seconds > 0 (a redelivery later than that runs again)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"done_ttl must be a positive number of seconds, got {value!r}")
    return float(value)


@dataclass(eq=False)
class TaskLock:
    """The lock one task run holds, on ``self.request.rlock`` while it runs.

    ``token`` is the fencing token of this grant: pass it to the resource the
    task writes, and have that resource refuse tokens lower than the last seen.
    """

    name: str
    lock: RLock
    token: int | None
    waited: float
    acquired_at: float = field(default_factory=time.monotonic)
    #: Set when the release found the hold gone (see :attr:`lost`).
    lost_at_release: bool = False

    @property
    def held(self) -> float:
        """Seconds since the run took the lock."""
        return time.monotonic() - self.acquired_at

    @property
    def lost(self) -> bool:
        """True when the run's hold was lost: another run may have held the lock too.

        While the body runs, as the watchdog has seen it; once the run has
        ended (``task_postrun``, ``after_return``), also as the release found it.
        """
        return self.lost_at_release or self.lock.lost


def run_locked(
    options: TaskLockOptions,
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    app: Celery,
    task: Any,
    body: Callable[[], _R],
    once_lease: float | None = None,
    once_queued: bool = False,
) -> _R | SkippedResult:
    """Run ``body()`` holding the lock ``options`` builds from ``func(*args, **kwargs)``.

    ``task`` is the running Task (None when the function is called outside
    one: then "retry" and "wait" raise LockTimeout instead of re-queueing).
    With ``once_lease``, the task's ``once`` marker follows the run
    (``once_queued``: the marker of ``once="queued"``). A lock server that
    cannot be reached is handled by ``on_unavailable`` (see :func:`_unavailable`).
    """
    name = build_key(options.key, func, args, kwargs)
    lock = get_lock(
        app,
        options.using,
        name,
        lease=options.lease,
        permits=options.permits,
        max_hold=options.max_hold,
    )
    if isinstance(lock, AliasAttached):
        lock.key_template = template_label(options.key)  # the metrics' bounded lock label
    # The top of the request stack is this run's own request (the task's
    # fallback request, used when nothing is pushed, is shared: never touch it).
    request = task.request_stack.top if task is not None else None
    task_id: str | None = None
    if request is not None and not request.called_directly:
        task_id = request.id
    marker = None
    if once_lease is not None and task_id is not None:
        marker = OnceMarker(lock, task.name, once_lease, queued_only=once_queued)
    # A delivery of this message whose run is going on or has ended is dropped.
    delivery = Delivery.of(task, request, lock, options.done_ttl, app=app)
    delivery.before_acquire()

    started = time.monotonic()
    acquired = _acquire(lock, options, task, request, marker=marker)
    waited = time.monotonic() - started
    if acquired is not True:
        delivery.when_busy()  # the holder may be a run of this very message
        ending: BaseException | None = None
        try:
            return _refused(task, options, lock, waited, refusal=acquired, app=app)
        except BaseException as error:
            ending = error
            raise
        finally:
            _end_marker(marker, task_id, ending, request)

    held = _acquired(name, lock, waited, delivery)
    if marker is not None and task_id is not None:
        marker.running(task_id)
    if request is not None:
        request.rlock = held
    ending = None
    try:
        result = _run_body(body, task, options, app)
    except BaseException as error:
        ending = error
        raise
    finally:
        try:
            delivery.finish(ending)  # before the release: no window for a duplicate
            _release(held)
            if ending is None and held.lost_at_release and options.on_lost == "fail":
                ending = LockLostError(
                    f"lock {name!r} was lost while the task ran (held {held.held:.3f}s): "
                    'failing the run, as on_lost="fail" asks',
                    name=name,
                )
                raise ending
        finally:
            _end_marker(marker, task_id, ending, request)
    return result


def _run_body(
    body: Callable[[], _R], task: Any, options: TaskLockOptions, app: Celery
) -> _R | SkippedResult:
    """``body()``; ``on_busy`` if a lock it takes gives way to break a deadlock.

    A lock the body takes while holding the run's may be the victim of a
    deadlock: :func:`_deadlocked` applies ``on_busy``. Its Retry is raised
    before the run's lock is released, as ``raise self.retry()`` in a body
    is: the run ends at once, and the message goes on.
    """
    try:
        return body()
    except DeadlockError as error:
        return _deadlocked(task, options, app, error)


def _acquired(name: str, lock: RLock, waited: float, delivery: Delivery) -> TaskLock:
    """The run's hold of the lock it has just taken.

    A run of the same message may have ended while this one waited for the
    lock (or, for a semaphore, hold a permit granted before this one): then
    the lock is given back and this delivery dropped.
    """
    held = TaskLock(name=name, lock=lock, token=lock.token, waited=waited)
    logger.info("lock %r acquired after waiting %.3fs (token %s)", name, waited, held.token)
    delivery.once_acquired(release=lambda: _release(held))
    return held


def _busy(task: Any, options: TaskLockOptions, lock: RLock, waited: float) -> SkippedResult:
    """Apply ``on_busy`` to a run that did not get its lock within its wait."""
    remaining = lock.ttl()
    try:
        holder = None if remaining is None else lock.holder()
    except LockUnavailableError:
        holder = None  # only the message's detail is lost
    # Who holds it, and whether its TTL is a lease's end or a watchdog's margin.
    lease = f"; {busy_reason(holder, remaining)}"
    if remaining is not None and not math.isfinite(remaining):
        # A key with no expiry (written by hand): look again after one timeout.
        remaining = lock.client.watchdog_timeout
    if options.on_busy == "skip":
        logger.info("lock %r busy after waiting %.3fs%s: skipped", lock.name, waited, lease)
        return SkippedResult(skipped=True, reason="lock busy", lock=lock.name)
    error = LockTimeout(
        f"lock {lock.name!r} busy after waiting {waited:.3f}s{lease}",
        name=lock.name,
        retry_after=remaining,
    )
    if options.on_busy == "raise" or task is None:
        logger.info("lock %r busy after waiting %.3fs%s: failing", lock.name, waited, lease)
        raise error
    # "retry", and "wait" after lock_timeout: re-queue for when the lock is
    # likely free (see retry_countdown).
    countdown = retry_countdown(task, lock, remaining)
    logger.info(
        "lock %r busy after waiting %.3fs%s: retrying in %.3fs",
        lock.name,
        waited,
        lease,
        countdown,
    )
    # retry() raises Retry, or `error` itself once max_retries is exhausted.
    raise task.retry(exc=error, countdown=countdown)


def _refused(
    task: Any,
    options: TaskLockOptions,
    lock: RLock,
    waited: float,
    *,
    refusal: bool | DeadlockError,
    app: Celery,
) -> SkippedResult:
    """``on_busy`` for a run that did not get its lock: busy, or a deadlock's victim."""
    if isinstance(refusal, DeadlockError):
        return _deadlocked(task, options, app, refusal)
    return _busy(task, options, lock, waited)


def _deadlocked(
    task: Any, options: TaskLockOptions, app: Celery, error: DeadlockError
) -> SkippedResult:
    """Apply ``on_busy`` to a run whose lock wait was a deadlock's victim (``error``).

    The run cannot wait on: the locks it holds are what the other members of
    the cycle wait for. ``"retry"`` and ``"wait"`` re-queue it (``max_retries``
    applies: past it, ``error`` itself is raised) for when the lock it waited
    for is likely free (:func:`retry_countdown`, at least one second), by when
    the member it gave way to has finished; ``"skip"`` skips it; ``"raise"``,
    and a call outside a worker run, raise ``error``. The cycle itself is
    logged by the lock's reporting (Django) and here.
    """
    name = error.name or "?"
    if options.on_busy == "skip":
        logger.warning("%s: skipped", error)
        return SkippedResult(skipped=True, reason="deadlock", lock=name)
    if options.on_busy == "raise" or task is None:
        logger.warning("%s: failing", error)
        raise error
    waited_for = get_lock(app, options.using, name) if error.name is not None else None
    countdown = MIN_RETRY_AFTER
    if waited_for is not None:
        countdown = max(countdown, retry_countdown(task, waited_for, None))
    error.retry_after = countdown
    logger.warning("%s: retrying in %.3fs", error, countdown)
    # retry() raises Retry, or `error` itself once max_retries is exhausted.
    raise task.retry(exc=error, countdown=countdown)


def _acquire(
    lock: RLock,
    options: TaskLockOptions,
    task: Any,
    request: Any,
    *,
    marker: OnceMarker | None,
) -> bool | DeadlockError:
    """Take the run's lock within ``options.wait``; ``on_unavailable`` when its server is down.

    ``request`` is the run's own request (None outside a task). The
    DeadlockError of a wait that gave way to break a deadlock is returned, for
    ``on_busy`` (the run's caller held a lock of the cycle: a nested run).
    """
    task_id = request.id if request is not None and not request.called_directly else None
    try:
        # Operators see which task holds it (rlock inspect, the admin).
        with holder_details(task_id=task_id or "", task_name=getattr(task, "name", None) or ""):
            return lock.acquire(blocking=True, timeout=options.wait, lease=options.lease)
    except DeadlockError as error:
        return error
    except LockUnavailableError as error:
        try:
            _unavailable(task, request, options, error)
        except BaseException as ending:
            _end_marker(marker, task_id, ending, request)
            raise


def _unavailable(
    task: Any, request: Any, options: TaskLockOptions, error: LockUnavailableError
) -> NoReturn:
    """Apply ``on_unavailable`` to a run whose lock server could not be reached.

    ``"retry"`` re-queues the task after :func:`unavailable_countdown`
    (``max_retries`` applies: past it, ``error`` itself is raised);
    ``"fail"``, and a call outside a worker run, raise ``error``. Either way
    what is raised or logged is the LockUnavailableError naming the server.
    """
    if options.on_unavailable == "fail" or request is None or request.called_directly:
        logger.warning("%s: failing", error)
        raise error
    countdown = unavailable_countdown(task)
    logger.warning("%s: retrying in %.3fs", error, countdown)
    # retry() raises Retry, or `error` itself once max_retries is exhausted.
    raise task.retry(exc=error, countdown=countdown)


def unavailable_countdown(task: Any) -> float:
    """Seconds before retrying a run whose lock server could not be reached.

    Celery's exponential back-off when the task asks for it (``retry_backoff``,
    ``retry_backoff_max``, ``retry_jitter``), else
    :data:`~django_rlock._web.responses.UNAVAILABLE_RETRY_AFTER`, the Retry-After
    of a view in the same outage (``default_retry_delay``, three minutes
    unless set, would leave the work waiting long after a short outage).
    """
    backoff = celery_backoff(task)
    return float(UNAVAILABLE_RETRY_AFTER) if backoff is None else backoff


def celery_backoff(task: Any) -> float | None:
    """The exponential back-off Celery would use for this retry of ``task``.

    None unless the task sets ``retry_backoff`` (``retry_backoff_max``,
    ``retry_jitter`` and the run's retry count apply as in Celery's autoretry).
    """
    backoff = getattr(task, "retry_backoff", False)
    if not backoff:
        return None
    return float(
        get_exponential_backoff_interval(
            factor=int(max(1.0, float(backoff))),
            retries=task.request.retries,
            maximum=int(getattr(task, "retry_backoff_max", 600)),
            full_jitter=bool(getattr(task, "retry_jitter", True)),
        )
    )


def retry_countdown(task: Any, lock: RLock, lease_left: float | None) -> float:
    """Seconds before a busy run's retry: when its lock is likely free.

    How long this lock (or its key template) is really held, as this process
    saw recently, else how long its current holder has held it so far, bounded
    by the holder's lease left and at least 1 s: the rule of a busy view's
    Retry-After (:mod:`django_rlock._observers.holdtimes`); the lease left for a lock of
    no alias. A task with Celery's ``retry_backoff`` waits at least the
    exponential back-off Celery itself would use (``retry_backoff_max``,
    ``retry_jitter``); ``max_retries`` is applied by ``task.retry()``.
    """
    seconds = lock_retry_after(lock, lease_left)
    if seconds is None:  # a lock of no alias: no hold history to go by
        seconds = 0.0 if lease_left is None else lease_left
    backoff = celery_backoff(task)
    return seconds if backoff is None else max(seconds, backoff)


def _release(held: TaskLock) -> None:
    """Give the run's lock back; a lost lock is reported, never raised.

    The task's work is done by now: failing it (or masking its own exception)
    would not undo an overlap, but the report must say that one may have
    happened. A lock server that stays unreachable is logged too: the hold
    expires by itself within its lease or the watchdog timeout.
    """
    unanswered: BaseException | None = None
    for pause in (*_RELEASE_RETRY_PAUSES, None):
        try:
            held.lock.release()
        except LockNotOwnedError as error:
            # LockLostError: the hold was known lost (the core has already sent
            # its loss report). Otherwise the run holds nothing any more: an
            # earlier attempt may have released it before its reply was lost,
            # but the key may as well have vanished first (a server restart):
            # only "lost" is safe to say.
            _report_lost(held, error, known=isinstance(error, LockLostError), after=unanswered)
            return
        except LockUnavailableError as error:
            # Unreleased, the hold would go on being renewed by this process's
            # watchdog: try again over a short blip before giving up.
            unanswered = error
            if pause is None:
                logger.error(
                    "lock %r could not be released (%r): it expires by itself within %s",
                    held.name,
                    error,
                    "its lease" if held.lock.lease else f"{held.lock.client.watchdog_timeout}s",
                )
                return
            time.sleep(pause)
            continue
        logger.info("lock %r released after holding %.3fs", held.name, held.held)
        return


def _report_lost(
    held: TaskLock,
    error: LockNotOwnedError,
    *,
    known: bool,
    after: BaseException | None,
) -> None:
    """Report a run whose release found its hold gone (``known``: the core said lost)."""
    held.lost_at_release = True
    if after is None:
        how = ""
    else:
        how = f" after a release attempt failed with {type(after).__name__} (did Redis restart?)"
    logger.error(
        "lock %r was lost while the task ran (held %.3fs)%s: another run may have "
        "overlapped this one",
        held.name,
        held.held,
        how,
    )
    # The core reports a loss it has seen itself; this one only the release
    # saw, so Django's lock_lost signal is sent from here.
    reporter = reporter_of(held.lock.backend) if isinstance(held.lock, AliasAttached) else None
    if not known and reporter is not None:
        reporter.report_lost(held.lock)


def _end_marker(
    marker: OnceMarker | None, task_id: str | None, error: BaseException | None, request: Any
) -> None:
    """Move the ``once`` marker on at the end of a run that ended with ``error``.

    A run that sent its message on (a retry, also one with ``throw=False``
    that the run did not raise) leaves its task queued. A marker that cannot
    be moved (its server is unreachable) is logged, never put in place of the
    run's own outcome: it expires within ``once_lease``.
    """
    if marker is None or task_id is None:
        return
    try:
        if (
            isinstance(error, Retry)
            or (isinstance(error, Reject) and error.requeue)
            or sent_on(request)
        ):
            marker.requeued(task_id)
        else:
            marker.done(task_id)
    except LockUnavailableError as unreachable:
        logger.warning("%s: it expires within its once_lease", unreachable)
