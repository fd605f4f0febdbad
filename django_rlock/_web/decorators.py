"""``@locked``: run a function, or a Django view, while holding a lock named from its call.

::

    from django_rlock import locked

    @locked("order:{order_id}", timeout=0)
    def pay(request, order_id): ...                # one payment per order at a time

    @locked("report:{customer.pk}", lease=60)
    def build_report(customer): ...                # any function; attributes work too

    @locked(lambda request, slug: f"page:{slug}")
    async def edit(request, slug): ...             # async views; a callable key

    @method_decorator(locked("order:{order_id}", timeout=2), name="post")
    class PayView(View): ...                       # class-based views

    @api_view(["POST"])
    @locked("order:{order_id}", timeout=0)
    def refund(request, order_id): ...             # Django REST framework views too

The key is ``key_template.format(**arguments)`` with the call's arguments
bound to the function's signature (defaults applied, ``**kwargs`` flattened),
so ``pay(request, 1)`` and ``pay(request, order_id=1)`` lock the same name. A
template naming a parameter the function lacks fails when decorating.

When the lock is still busy after ``timeout`` seconds, a view (a function
whose first argument, or second after ``self``, is an ``HttpRequest`` or
Django REST framework's ``Request``) answers ``409 Conflict`` with a
``Retry-After`` header (how long the lock is really held, recently: see
:mod:`django_rlock._observers.holdtimes`) instead of failing with a 500. ``RLOCK_BUSY_RESPONSE`` (or
``busy_response=``) changes the status, names a callable
``(request, error) -> HttpResponse``, or is ``"raise"`` to let
:class:`~django_rlock.exceptions.LockTimeout` propagate. Anything that is not
a view always raises :class:`LockTimeout`.

When the wait for the lock is the victim of a deadlock (the caller already
holds a lock that another waiter needs, and this wait closed the cycle:
:class:`~django_rlock.exceptions.DeadlockError`, see docs/deadlocks.md),
a view answers as for a busy lock (``409 Conflict`` with a ``Retry-After`` of
how long the lock is really held, or ``BUSY_RESPONSE``'s answer); the cycle is
logged (WARNING on ``django_rlock.lock``, naming every lock and holder). Inside
a transaction the lock is bound to (``transaction="auto"``), the transaction
is rolled back, as a database rolls back its own deadlock's victim: nothing
the request did is committed, and the locks it kept for the transaction are
released at once, so the other members of the cycle go on.

When the lock server cannot be reached, a view answers ``503 Service
Unavailable`` with ``Retry-After: 5`` (the view does not run; the error,
naming the alias, is logged); with ``busy_response="raise"``, and for
anything that is not a view, :class:`LockUnavailableError` propagates.

The default ``timeout=None`` waits as long as it takes; views usually want a
small timeout.

A view's answer tells the truth about its work when its lock gives up after
the view has run (a hold lost to an operator's force-release or to an outage
past the watchdog timeout; a release that cannot reach the server):

* the work was done: the view's own response goes out, with the header
  ``X-Lock-Release: lost`` (the hold expired or was taken over before the
  view ended: the work ran, perhaps not alone) or ``X-Lock-Release: failed``
  (the release did not reach the server: the lock expires by itself), and
  the failure is logged as an ERROR on ``django_rlock.lock``; a loss is also
  sent as ``lock_lost`` and counted in ``django_rlock_lost_total``. This
  holds with any ``busy_response``: raising would turn done work into a 500;
* the hold was known lost as the view returned inside a transaction it is
  bound to (``transaction="auto"``: ``ATOMIC_REQUESTS``, or an ``atomic()``
  around the call): nothing is committed yet, and nothing is. The atomic
  block around the view (under ``ATOMIC_REQUESTS``, the request's
  transaction) is rolled back and the view answers ``503`` with
  ``Retry-After: 5`` and ``X-Lock-Release: lost`` (``busy_response="raise"``:
  the :class:`~django_rlock.exceptions.LockLostError` propagates through the
  atomic blocks, which roll back). A loss the release after COMMIT finds
  leaves the committed work's response as it is, marked ``X-Lock-Release: lost``;
* the view raised: its own error propagates; a failed release is only logged.

No header value names the lock. Anything that is not a view raises the
release's error, as a ``with`` block does.

Inside a transaction (``ATOMIC_REQUESTS = True``, or a call made inside
``transaction.atomic()``), the lock is kept until the transaction commits or
rolls back, so the next holder reads what this call wrote
(``transaction="auto"``, the default; see :mod:`django_rlock._scopes.transactions`).

``fair=True`` takes the fair lock of the name (granted in arrival order),
``mode="read"`` or ``mode="write"`` a side of its read-write lock (many
readers or one writer), ``permits=N`` one permit of its semaphore.

An async function uses the backend's asyncio lock natively (its owner is the
request's task; no thread hop on the Redis, embedded and LocMem backends); an
alias without one (a cache alias, Sentinel, Cluster) enters and releases the
lock on one worker thread of its own per call.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, TypeVar, cast

from asgiref.sync import sync_to_async
from django.db.transaction import set_rollback
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase

from django_rlock import _conf as conf
from django_rlock._handler import locks
from django_rlock._keys import KeyTemplate, build_key, check_template, template_label
from django_rlock._observers.retryafter import lock_retry_after
from django_rlock._scopes.transactions import open_transactions, when_released
from django_rlock._web.responses import (
    FAILED,
    LOST,
    busy_status_response,
    invalid_name_response,
    mark_release,
    rolled_back_response,
    unavailable_response,
)
from django_rlock.backends._locks import AsyncWithTwin
from django_rlock.backends._threadowned import ThreadOwnedLock
from django_rlock.backends._types import AliasAttached, AsyncLock
from django_rlock.core import RLock
from django_rlock.core._faces import (
    LockOptions,
    check_lease,
    check_max_hold,
    check_permits,
    check_timeout,
)
from django_rlock.core.defaults import DEFAULT_LOCK_ALIAS
from django_rlock.core.exceptions import (
    DeadlockError,
    InvalidLockNameError,
    LockError,
    LockNotOwnedError,
    LockTimeout,
    LockUnavailableError,
)

F = TypeVar("F", bound=Callable[..., Any])

logger = logging.getLogger("django_rlock.lock")


def locked(
    key_template: KeyTemplate,
    *,
    using: str = DEFAULT_LOCK_ALIAS,
    timeout: float | None = None,
    lease: float | None = None,
    busy_response: object = conf.UNSET,
    permits: int | None = None,
    fair: bool = False,
    mode: str | None = None,
    transaction: str | None = None,
    max_hold: float | None = None,
) -> Callable[[F], F]:
    """Hold the lock named by ``key_template`` for each call of the decorated function.

    ``using`` is the RLOCKS alias, ``timeout`` the longest wait in seconds
    (None: as long as it takes), ``lease`` a fixed expiry in seconds (None: the
    watchdog renews it). ``busy_response`` overrides ``RLOCK_BUSY_RESPONSE``
    for this view: an HTTP status, ``"raise"``, or a callable
    ``(request, error) -> HttpResponse``. ``permits=N`` holds one permit of
    the semaphore ``key_template`` of N permits instead of the lock: at most
    N calls run at once (busy handling is the same). ``fair=True`` takes the
    fair lock, ``mode="read"``/``"write"`` a side of the read-write lock.
    ``transaction`` (``"auto"``/``"ignore"``, None: the alias's setting) and
    ``max_hold`` (seconds, None: the alias's setting) are :func:`~django_rlock.rlock`'s.
    """
    _check_amounts(timeout, lease, permits, max_hold)
    _check_choices(using, busy_response, transaction)
    kind = _check_kind(permits, fair, mode)

    def decorator(func: F) -> F:
        _refuse_a_celery_task(func, key_template)
        signature_source = _signature_source(func)
        template = check_template(key_template, signature_source)
        location = _definition(func)
        where = _Where(location, template_label(template), transaction)
        spec = LockedSpec(
            template,
            signature_source,
            using,
            timeout,
            lease,
            permits,
            fair=fair,
            mode=mode,
            transaction=transaction,
            max_hold=max_hold,
        )
        # Worked out once: every call of the function passes the same keywords.
        given = _Options(timeout, lease, max_hold).given()
        view_answers = _ViewAnswers(using, busy_response, where.location)

        def take(args: tuple[Any, ...], kwargs: dict[str, Any]) -> RLock:
            name = build_key(template, signature_source, args, kwargs)
            return _described(_sync_lock(using, name, kind, permits, given), where)

        def take_async(args: tuple[Any, ...], kwargs: dict[str, Any]) -> AsyncLock:
            name = build_key(template, signature_source, args, kwargs)
            return _described(_async_lock(using, name, kind, permits, given), where)

        def busy(args: tuple[Any, ...], error: _Busy, lock: object) -> HttpResponse:
            return _answer_busy(args, _honest(error, lock), using, busy_response, lock)

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                try:
                    lock = take_async(args, kwargs)
                except InvalidLockNameError as error:
                    return _refuse_name(args, error)
                try:
                    await lock.__aenter__()
                except (LockTimeout, LockUnavailableError, DeadlockError) as error:
                    # The honest Retry-After may read the holder: blocking I/O, on a thread.
                    return await sync_to_async(busy)(args, error, lock)
                if _request_of(args) is None:
                    try:
                        return await func(*args, **kwargs)
                    finally:
                        await lock.__aexit__(None, None, None)
                return await _run_async_view(lock, func, args, kwargs, view_answers)

            return cast(F, async_wrapper)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            task = _running_task(wrapper)
            if task is not None:
                return _run_as_task(task, func, args, kwargs)
            try:
                lock = take(args, kwargs)
            except InvalidLockNameError as error:
                return _refuse_name(args, error)
            try:
                lock.__enter__()
            except (LockTimeout, LockUnavailableError, DeadlockError) as error:
                return busy(args, error, lock)
            if _request_of(args) is None:
                try:
                    return func(*args, **kwargs)
                finally:
                    # The with-block's end: kept until the transaction ends, if one is open.
                    lock.__exit__(None, None, None)
            return _run_view(lock, func, args, kwargs, view_answers)

        wrapper.__rlock_locked__ = spec  # type: ignore[attr-defined]  # read by celery_rlock
        return cast(F, wrapper)

    return decorator


@dataclass(frozen=True)
class _Options:
    """The lock options ``@locked`` passes to every lock it takes."""

    timeout: float | None
    lease: float | None
    max_hold: float | None

    def given(self) -> LockOptions:
        """The options set, as keywords: those left None are the lock's defaults anyway."""
        given = LockOptions()
        if self.timeout is not None:
            given["timeout"] = self.timeout
        if self.lease is not None:
            given["lease"] = self.lease
        if self.max_hold is not None:
            given["max_hold"] = self.max_hold
        return given


#: The kinds ``@locked`` can hold: the lock, the fair lock, a read-write lock's
#: side, or a semaphore's permit.
_KINDS = ("lock", "fair", "read", "write", "permit")


def _check_kind(permits: object, fair: object, mode: object) -> str:
    """Which kind ``permits``, ``fair`` and ``mode`` ask for; at most one of them may be given."""
    if not isinstance(fair, bool):
        raise ValueError(f"fair must be True or False, got {fair!r}")
    if mode not in (None, "read", "write"):
        raise ValueError(f"mode must be 'read', 'write' or None, got {mode!r}")
    given = [
        what
        for what, chosen in (("permits", permits is not None), ("fair", fair), ("mode", mode))
        if chosen
    ]
    if len(given) > 1:
        raise ValueError(f"{' and '.join(given)} choose different kinds of lock: give one of them")
    if permits is not None:
        return "permit"
    if fair:
        return "fair"
    return cast(str, mode) if mode is not None else "lock"


L = TypeVar("L")


@dataclass(frozen=True)
class _Where:
    """What every lock of one decorated function is told: the code, the template, the binding."""

    location: str | None
    label: str
    transaction: str | None


def _described(lock: L, where: _Where) -> L:
    """``lock``, told where it is taken, its key template and its transaction binding."""
    # An alias with no native asyncio lock runs its sync lock on a thread.
    inner = lock.lock if isinstance(lock, ThreadOwnedLock) else lock
    if isinstance(inner, AliasAttached):
        inner.location = where.location
        inner.key_template = where.label
    if where.transaction is not None and isinstance(inner, AsyncWithTwin):
        inner.transaction = where.transaction
    return lock


def _check_choices(using: object, busy_response: object, transaction: object) -> None:
    """Refuse a bad ``using``, ``busy_response`` or ``transaction`` when decorating."""
    if not isinstance(using, str):
        raise ValueError(f"using must be a lock alias (a str), not {type(using).__name__}")
    if busy_response is not conf.UNSET:
        conf.check_busy_response(busy_response, "the busy_response argument", resolve=False)
    if transaction is not None and transaction not in conf.TRANSACTION_CHOICES:
        choices = " or ".join(map(repr, conf.TRANSACTION_CHOICES))
        raise ValueError(f"transaction must be {choices} (or None), got {transaction!r}")


def _check_amounts(timeout: object, lease: object, permits: object, max_hold: object) -> None:
    """Refuse a bad ``timeout``, ``lease``, ``permits`` or ``max_hold`` when decorating."""
    check_timeout(timeout)
    check_lease(lease)
    check_max_hold(max_hold)
    if permits is not None:
        check_permits(permits)


def _sync_lock(using: str, name: str, kind: str, permits: int | None, given: LockOptions) -> RLock:
    """The lock ``name`` of alias ``using`` of ``kind`` (see :data:`_KINDS`) made with ``given``."""
    backend = locks[using]
    if kind == "permit":
        return backend.semaphore(name, cast(int, permits), **given)
    if kind == "fair":
        return backend.fair_lock(name, **given)
    if kind in ("read", "write"):
        sides = backend.read_write_lock(name, **given)
        return sides.read if kind == "read" else sides.write
    return backend.lock(name, **given)


def _async_lock(
    using: str, name: str, kind: str, permits: int | None, given: LockOptions
) -> AsyncLock:
    """The asyncio twin of :func:`_sync_lock`."""
    backend = locks[using]
    if kind == "permit":
        return backend.async_semaphore(name, cast(int, permits), **given)
    if kind == "fair":
        return backend.async_fair_lock(name, **given)
    if kind in ("read", "write"):
        sides = backend.async_read_write_lock(name, **given)
        return sides.read if kind == "read" else sides.write
    return backend.async_lock(name, **given)


#: What a locked view answers instead of running: its lock stayed busy, its
#: server is unreachable, or its wait was a deadlock's victim.
_Busy = LockTimeout | LockUnavailableError | DeadlockError


def _honest(error: _Busy, lock: object) -> _Busy:
    """``error`` with the Retry-After of how long the lock is really held, not its lease.

    For a deadlock's victim too: the member it gave way to holds the lock it
    waited for, and finishes its work under it.
    """
    if isinstance(error, LockTimeout | DeadlockError) and error.name is not None:
        honest = lock_retry_after(lock, error.retry_after)
        if honest is not None:
            error.retry_after = honest
    return error


@dataclass(frozen=True)
class _ViewAnswers:
    """What a locked view's answer to a failed release needs: its alias, BUSY_RESPONSE, place."""

    using: str
    busy_response: object
    location: str | None


def _run_view(
    lock: RLock,
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    answers: _ViewAnswers,
) -> Any:
    """Run the view ``func`` under ``lock`` (entered); an answer true to what its work became.

    * The view raised: its error goes on (a release failure is only logged).
    * The release failed once the view's response was made: that response,
      its work done, marked ``X-Lock-Release: lost`` or ``failed``, the
      failure logged as an ERROR (a loss is also sent as ``lock_lost`` and
      counted in ``django_rlock_lost_total`` by the engine's reporting).
    * The hold was known lost as the view returned inside a transaction
      it was bound to (``transaction="auto"``): the view's changes are not
      committed yet, and are not committed: the transaction is rolled back
      and the view answers 503 (``BUSY_RESPONSE = "raise"``: the LockLostError
      goes through the atomic blocks around the view, which roll back).
    """
    try:
        response = func(*args, **kwargs)
    except BaseException:
        try:
            lock.__exit__(None, None, None)
        except LockError as error:
            _log_unreleased(error, answers.location, None)
        raise
    bound = _bound_to_a_transaction(lock)
    try:
        # The with-block's end: kept until the transaction ends, if one is open.
        lock.__exit__(None, None, None)
    except LockError as error:
        if not bound:
            _log_unreleased(error, answers.location, response)
            mark_release(response, _outcome(error))
            return response
        # Ending a bound block raises only for a hold known lost (_transactions).
        if conf.busy_response(answers.using, answers.busy_response) == "raise":
            raise
        for connection in open_transactions():
            set_rollback(True, using=connection.alias)
        logger.error(
            "lock %r of the view %s was lost before its transaction committed (%s): "
            "the view's changes are rolled back, and it answers 503",
            error.name,
            answers.location,
            error,
        )
        return rolled_back_response()
    if bound:
        _mark_if_lost_at_commit(lock, response)
    return response


def _mark_if_lost_at_commit(lock: RLock, response: object) -> None:
    """Mark ``response`` ``X-Lock-Release: lost`` if the release after COMMIT finds the hold lost.

    Django commits (and runs its on-commit hooks, then the release the
    transaction owes, :mod:`django_rlock._scopes.transactions`) before the response
    leaves its handler, so the header can still tell what the deferred
    release found. A rollback's release marks nothing: the view's changes
    are undone, and the response says whatever the view said about them. A
    release that fails for want of the server is logged by
    :mod:`django_rlock._scopes.transactions` but not marked: the lock was not lost,
    and expires by itself.
    """
    if not isinstance(response, HttpResponseBase):
        return

    def released(lost: bool) -> None:
        if lost:
            mark_release(response, LOST)

    when_released(lock, released)


async def _run_async_view(
    lock: AsyncLock,
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    answers: _ViewAnswers,
) -> Any:
    """:func:`_run_view` for an async view; its hold is never bound to a transaction.

    (Django runs no transaction across an ``await``.)
    """
    try:
        response = await func(*args, **kwargs)
    except BaseException:
        try:
            await lock.__aexit__(None, None, None)
        except LockError as error:
            _log_unreleased(error, answers.location, None)
        raise
    try:
        await lock.__aexit__(None, None, None)
    except LockError as error:
        _log_unreleased(error, answers.location, response)
        mark_release(response, _outcome(error))
    return response


def _bound_to_a_transaction(lock: object) -> bool:
    """Whether ending ``lock``'s block now waits for an open transaction's end.

    Then its changes are not committed yet (see :mod:`django_rlock._scopes.transactions`).
    """
    return getattr(lock, "transaction", None) == "auto" and bool(open_transactions())


def _roll_back_the_victim(error: DeadlockError) -> None:
    """Roll back the transactions a deadlock's victim is in, as a database does.

    The holds the view's code kept for them (``transaction="auto"``) are part
    of the cycle: the rollback releases them as soon as the view returns, and
    nothing the request did is committed (it answers "busy, retry").
    """
    for connection in open_transactions():
        set_rollback(True, using=connection.alias)
    logger.warning(
        "a view gave up lock %r to break a deadlock: its transaction is rolled back, "
        "releasing the locks kept for it",
        error.name,
    )


def _outcome(error: LockError) -> str:
    """What became of a release that raised ``error``: the header's ``lost`` or ``failed``."""
    return LOST if isinstance(error, LockNotOwnedError) else FAILED


def _log_unreleased(error: LockError, location: str | None, response: object) -> None:
    """Log, as an ERROR, a view's release that failed after its work; ``response``: its answer."""
    if response is None:
        answer = "raised"
    else:
        status = getattr(response, "status_code", None)
        answer = f"answered {status}" if status is not None else "returned"
    if isinstance(error, LockNotOwnedError):
        logger.error(
            "lock %r was lost before the view %s ended (%s): the view %s, its work done but "
            "perhaps not alone",
            error.name,
            location,
            error,
            answer,
        )
    else:
        logger.error(
            "releasing lock %r failed after the view %s %s, its work done (%s): the lock "
            "expires by itself",
            error.name,
            location,
            answer,
            error,
        )


def _refuse_name(args: tuple[Any, ...], error: InvalidLockNameError) -> HttpResponse:
    """A view whose lock name, built from the request, breaks a naming rule: 400; else raise."""
    if _request_of(args) is None:
        raise error
    return invalid_name_response(error)


def _answer_busy(
    args: tuple[Any, ...], error: _Busy, using: str, option: object, lock: object
) -> HttpResponse:
    """A locked view's answer when it cannot run (see :data:`_Busy`); else raise."""
    request = _request_of(args)
    if request is None:
        raise error
    answer = conf.busy_response(using, option)
    if answer == "raise":
        raise error  # through the atomic blocks around the view, which roll back
    if isinstance(error, LockUnavailableError):
        return unavailable_response(error)
    if isinstance(error, DeadlockError) and _bound_to_a_transaction(lock):
        _roll_back_the_victim(error)
    if callable(answer):
        return answer(request, error)
    return busy_status_response(error, cast(int, answer))


@dataclass(frozen=True)
class LockedSpec:
    """What ``@locked`` was given, on the wrapper as ``__rlock_locked__``.

    celery_rlock reads it to run a task body decorated here exactly as its
    own ``locked`` would (``on_busy="retry"``, ``self.request.rlock``...).
    """

    key_template: KeyTemplate
    func: Callable[..., Any]
    using: str
    timeout: float | None
    lease: float | None
    #: Hold one permit of a semaphore of this many permits instead of the lock.
    permits: int | None = None
    #: Hold the fair lock of the name instead.
    fair: bool = False
    #: Hold the read ("read") or write ("write") side of the name's read-write lock.
    mode: str | None = None
    #: Whether the hold outlives its call until an open transaction ends (None: the alias's).
    transaction: str | None = None
    #: The hold's bound in seconds (None: the alias's MAX_HOLD).
    max_hold: float | None = None


def _refuse_a_celery_task(func: object, key_template: KeyTemplate) -> None:
    """Refuse to sit above ``@app.task``: the task's registered run could not change."""
    celery = sys.modules.get("celery")
    if celery is None:
        return  # no task can exist
    from celery.local import Proxy  # noqa: PLC0415 -- only when Celery is in use

    # type(), not isinstance(): a lazy task Proxy would evaluate (and bind) itself.
    if issubclass(type(func), celery.Task | Proxy):
        template = key_template if isinstance(key_template, str) else "..."
        raise TypeError(
            "put @locked under the task decorator, so that it wraps the task's function:\n"
            "    @app.task  # or @shared_task\n"
            f"    @locked({template!r})\n"
            "    def ...\n"
            "(or use @app.task(base=celery_rlock.LockedTask, lock=...))"
        )


def _running_task(wrapper: Callable[..., Any]) -> Any:
    """The Celery task running now whose body is ``wrapper``, else None.

    Read at call time: the decorator cannot tell, when it runs, that
    ``@app.task`` will wrap it next.
    """
    state = sys.modules.get("celery._state")
    if state is None:
        return None
    task = state.get_current_task()
    if task is None:
        return None
    run = task.run
    return task if getattr(run, "__func__", run) is wrapper else None


#: How a Celery task's body runs under its lock: ``runner(task, func, args, kwargs)``.
TaskRunner = Callable[[Any, Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]

#: The entry point group through which celery_rlock offers its runner (setup.cfg).
TASK_RUNNER_GROUP = "django_rlock.task_runner"

_task_runners: list[TaskRunner] = []


def register_task_runner(runner: TaskRunner) -> None:
    """Run the bodies of Celery tasks decorated with ``locked`` through ``runner``.

    celery_rlock registers its own when it is imported, as a Django app
    registers its signal receivers: the Django face never imports the Celery
    face, which builds on it.
    """
    _task_runners[:] = [runner]


def _task_runner() -> TaskRunner:
    """The registered runner; else the one an installed package offers (its entry point)."""
    if not _task_runners:
        for entry in entry_points(group=TASK_RUNNER_GROUP):
            register_task_runner(entry.load())
            break
        else:
            raise RuntimeError(
                "@locked runs as a Celery task's body, but no task runner is registered: "
                "install django-rlock[celery] (celery_rlock registers it)"
            )
    return _task_runners[0]


def _run_as_task(
    task: Any, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    return _task_runner()(task, func, args, kwargs)


def _request_of(args: tuple[Any, ...]) -> HttpRequest | None:
    """The request of a view call: its first argument, or its second after ``self``.

    Django's ``HttpRequest``, or Django REST framework's ``Request``, which
    wraps one without being one (``@api_view`` functions, ``APIView`` and
    ``ViewSet`` methods receive it). The view's own request is returned, so a
    ``BUSY_RESPONSE`` callable gets what the view would have got.
    """
    for argument in args[:2]:
        if isinstance(argument, HttpRequest) or _is_drf_request(argument):
            return cast(HttpRequest, argument)  # DRF's Request proxies HttpRequest's attributes
    return None


def _is_drf_request(argument: object) -> bool:
    """Whether ``argument`` is Django REST framework's ``Request``.

    DRF stays optional: a DRF request exists only once DRF's module is
    imported, so the module is looked up, never imported here.
    """
    drf = sys.modules.get("rest_framework.request")
    return drf is not None and isinstance(argument, drf.Request)


def _signature_source(func: Callable[..., Any]) -> Callable[..., Any]:
    """What to read the signature from.

    ``method_decorator`` hands decorators ``partial(bound_method)`` with
    ``__wrapped__`` set to the unbound method, whose signature starts with
    ``self``; the bound method's signature is the one the call matches.
    """
    if isinstance(func, functools.partial) and not func.args and not func.keywords:
        return func.func
    return func


def _definition(func: Callable[..., Any]) -> str | None:
    """``file:line in qualname`` of the decorated code, for the slow-lock log."""
    target: Any = func.func if isinstance(func, functools.partial) else func
    target = inspect.unwrap(target)
    target = getattr(target, "__func__", target)
    code = getattr(target, "__code__", None)
    if code is None:
        return None
    return f"{code.co_filename}:{code.co_firstlineno} in {target.__qualname__}"
