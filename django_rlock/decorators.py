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

The key is ``key_template.format(**arguments)`` with the call's arguments
bound to the function's signature (defaults applied, ``**kwargs`` flattened),
so ``pay(request, 1)`` and ``pay(request, order_id=1)`` lock the same name. A
template naming a parameter the function lacks fails when decorating.

When the lock is still busy after ``timeout`` seconds, a view (a function
whose first argument is an ``HttpRequest``) answers ``409 Conflict`` with a
``Retry-After`` header (how long the lock is really held, recently: see
:mod:`django_rlock.holdtimes`) instead of failing with a 500. ``RLOCK_BUSY_RESPONSE`` (or
``busy_response=``) changes the status, names a callable
``(request, error) -> HttpResponse``, or is ``"raise"`` to let
:class:`~django_rlock.exceptions.LockTimeout` propagate. Anything that is not
a view always raises :class:`LockTimeout`.

When the lock server cannot be reached, a view answers ``503 Service
Unavailable`` with ``Retry-After: 5`` (the view does not run; the error,
naming the alias, is logged); with ``busy_response="raise"``, and for
anything that is not a view, :class:`LockUnavailableError` propagates.

The default ``timeout=None`` waits as long as it takes; views usually want a
small timeout.

An async function uses the backend's asyncio lock natively (its owner is the
request's task; no thread hop on the Redis, embedded and LocMem backends); an
alias without one (a cache alias, Sentinel, Cluster) enters and releases the
lock on one worker thread of its own per call.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar, cast

from django.http import HttpRequest, HttpResponse

from django_rlock import conf
from django_rlock.aliaslocks import AliasLock
from django_rlock.aliassemaphores import AliasSemaphore, AnyAliasLock
from django_rlock.backends.base import AsyncLock
from django_rlock.core.exceptions import LockTimeout, LockUnavailableError
from django_rlock.core.lock import RLock
from django_rlock.core.names import check_lease, check_timeout
from django_rlock.core.semaphore_scripts import check_permits
from django_rlock.handler import locks
from django_rlock.keys import KeyTemplate, build_key, check_template, template_label
from django_rlock.threadowned import ThreadOwnedLock

__all__ = ["UNAVAILABLE_RETRY_AFTER", "busy_status_response", "locked", "unavailable_response"]

F = TypeVar("F", bound=Callable[..., Any])

logger = logging.getLogger("django_rlock.lock")

#: The Retry-After (seconds) of a view whose lock server is unreachable: an
#: outage has no known end, and a few seconds spreads the clients' retries.
UNAVAILABLE_RETRY_AFTER: Final = 5


def locked(
    key_template: KeyTemplate,
    *,
    using: str = conf.DEFAULT_LOCK_ALIAS,
    timeout: float | None = None,
    lease: float | None = None,
    busy_response: object = conf.UNSET,
    permits: int | None = None,
) -> Callable[[F], F]:
    """Hold the lock named by ``key_template`` for each call of the decorated function.

    ``using`` is the RLOCKS alias, ``timeout`` the longest wait in seconds
    (None: as long as it takes), ``lease`` a fixed expiry in seconds (None: the
    watchdog renews it). ``busy_response`` overrides ``RLOCK_BUSY_RESPONSE``
    for this view: an HTTP status, ``"raise"``, or a callable
    ``(request, error) -> HttpResponse``. ``permits=N`` holds one permit of
    the semaphore ``key_template`` of N permits instead of the lock: at most
    N calls run at once (busy handling is the same).
    """
    _check_amounts(timeout, lease, permits)
    if not isinstance(using, str):
        raise ValueError(f"using must be a lock alias (a str), not {type(using).__name__}")
    if busy_response is not conf.UNSET:
        conf.check_busy_response(busy_response, "the busy_response argument", resolve=False)

    def decorator(func: F) -> F:
        _refuse_a_celery_task(func, key_template)
        signature_source = _signature_source(func)
        template = check_template(key_template, signature_source)
        location = _definition(func)
        label = template_label(template)
        spec = LockedSpec(template, signature_source, using, timeout, lease, permits)

        def take(args: tuple[Any, ...], kwargs: dict[str, Any]) -> RLock:
            name = build_key(template, signature_source, args, kwargs)
            lock = _sync_lock(using, name, permits, timeout, lease)
            if isinstance(lock, AliasLock | AliasSemaphore):
                lock.location = location
                lock.key_template = label
            return lock

        def take_async(args: tuple[Any, ...], kwargs: dict[str, Any]) -> AsyncLock:
            name = build_key(template, signature_source, args, kwargs)
            lock = _async_lock(using, name, permits, timeout, lease)
            # An alias with no native asyncio lock runs its sync lock on a thread.
            inner = lock.lock if isinstance(lock, ThreadOwnedLock) else lock
            if isinstance(inner, AnyAliasLock):
                inner.location = location
                inner.key_template = label
            return lock

        def busy(args: tuple[Any, ...], error: LockTimeout | LockUnavailableError) -> HttpResponse:
            return _answer_busy(args, _honest(error, using, label), using, busy_response)

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                lock = take_async(args, kwargs)
                try:
                    await lock.__aenter__()
                except (LockTimeout, LockUnavailableError) as error:
                    return busy(args, error)
                try:
                    return await func(*args, **kwargs)
                finally:
                    await lock.__aexit__(None, None, None)

            return cast(F, async_wrapper)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            task = _running_task(wrapper)
            if task is not None:
                return _run_as_task(task, func, args, kwargs)
            lock = take(args, kwargs)
            try:
                lock.__enter__()
            except (LockTimeout, LockUnavailableError) as error:
                return busy(args, error)
            try:
                return func(*args, **kwargs)
            finally:
                lock.release()

        wrapper.__rlock_locked__ = spec  # type: ignore[attr-defined]  # read by celery_rlock
        return cast(F, wrapper)

    return decorator


def _check_amounts(timeout: object, lease: object, permits: object) -> None:
    """Refuse a bad ``timeout``, ``lease`` or ``permits`` when decorating, not at the first call."""
    check_timeout(timeout)
    check_lease(lease)
    if permits is not None:
        check_permits(permits)


def _sync_lock(
    using: str, name: str, permits: int | None, timeout: float | None, lease: float | None
) -> RLock:
    """The lock ``name`` of alias ``using``, or one permit's semaphore when ``permits``."""
    backend = locks[using]
    if permits is None:
        return backend.lock(name, timeout=timeout, lease=lease)
    return backend.semaphore(name, permits, timeout=timeout, lease=lease)


def _async_lock(
    using: str, name: str, permits: int | None, timeout: float | None, lease: float | None
) -> AsyncLock:
    """The asyncio twin of :func:`_sync_lock`."""
    backend = locks[using]
    if permits is None:
        return backend.async_lock(name, timeout=timeout, lease=lease)
    return backend.async_semaphore(name, permits, timeout=timeout, lease=lease)


def busy_status_response(error: LockTimeout, status: int) -> HttpResponse:
    """What a view answers when its lock stayed busy and BUSY_RESPONSE is a status.

    ``status`` (409 by default) with a Retry-After taken from ``error``. The
    body does not name the lock: lock names may carry ids the client should
    not see. (Not itself a BUSY_RESPONSE callable, which takes ``(request, error)``.)
    """
    retry_after = error.retry_after
    seconds = 1 if retry_after is None or not math.isfinite(retry_after) else retry_after
    response = HttpResponse(
        "This resource is busy with another request; retry later.\n",
        status=status,
        content_type="text/plain; charset=utf-8",
    )
    response["Retry-After"] = str(max(1, math.ceil(seconds)))
    return response


def unavailable_response(error: LockUnavailableError) -> HttpResponse:
    """What a view answers when its lock server cannot be reached: 503 and Retry-After.

    The lock was not taken and the view did not run. The error (naming the
    alias) goes to the log; the body names neither the lock nor the server.
    """
    logger.error("%s", error)
    response = HttpResponse(
        "The service is temporarily unavailable; retry later.\n",
        status=503,
        content_type="text/plain; charset=utf-8",
    )
    response["Retry-After"] = str(UNAVAILABLE_RETRY_AFTER)
    return response


def _honest(
    error: LockTimeout | LockUnavailableError, using: str, label: str
) -> LockTimeout | LockUnavailableError:
    """``error`` with the Retry-After of how long the lock is really held, not its lease."""
    if isinstance(error, LockTimeout) and error.name is not None:
        error.retry_after = locks[using].hold_times.retry_after(
            error.name, label, error.retry_after
        )
    return error


def _answer_busy(
    args: tuple[Any, ...], error: LockTimeout | LockUnavailableError, using: str, option: object
) -> HttpResponse:
    """A view's answer when its lock stayed busy or its server is unreachable; else raise."""
    request = _request_of(args)
    if request is None:
        raise error
    answer = conf.busy_response(using, option)
    if answer == "raise":
        raise error
    if isinstance(error, LockUnavailableError):
        return unavailable_response(error)
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


def _run_as_task(
    task: Any, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    # celery_rlock builds on django_rlock (never the reverse at import time):
    # loaded only here, inside a Celery task run.
    from celery_rlock.decorators import run_task_body  # noqa: PLC0415

    return run_task_body(task, func, args, kwargs)


def _request_of(args: tuple[Any, ...]) -> HttpRequest | None:
    """The request of a view call: its first argument, or its second after ``self``."""
    for argument in args[:2]:
        if isinstance(argument, HttpRequest):
            return argument
    return None


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
