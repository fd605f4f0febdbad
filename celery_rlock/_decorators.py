"""``locked``: django_rlock's decorator, made task-aware.

Stack it under the task decorator, so the task's body is the locked function::

    @app.task(bind=True, max_retries=5)
    @locked("order:{order_id}", on_busy="retry")
    def charge(self, order_id): ...

Inside a run, the lock behaves exactly as with ``LockedTask`` (``on_busy`` can
re-queue through the task's ``retry``; ``self.request.rlock`` is set). Called
outside a task, the function still runs under its lock, and "retry" and "wait"
raise LockTimeout when the lock stays busy, as ``Task.retry`` does for a task
called directly. Above the task decorator it would receive a Task, whose
registered run it cannot change safely: that is refused at decoration time.

``django_rlock.locked`` under ``@app.task`` behaves exactly like this one (with
the default ``on_busy``): it hands its runs to :func:`run_task_body`.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from celery import Task
from celery._state import get_current_app, get_current_task
from celery.local import Proxy

from celery_rlock._guard import (
    DEFAULT_ON_BUSY,
    DEFAULT_ON_LOST,
    DEFAULT_ON_UNAVAILABLE,
    OnBusy,
    OnLost,
    OnUnavailable,
    SkippedResult,
    TaskLockOptions,
    run_locked,
)
from django_rlock._celeryface import KeyTemplate, LockedSpec, register_task_runner
from django_rlock.core.defaults import DEFAULT_LOCK_ALIAS

_P = ParamSpec("_P")
_R = TypeVar("_R")

# The options of every function decorated here, looked up by the worker checks.
_locked_functions: weakref.WeakKeyDictionary[Callable[..., Any], TaskLockOptions] = (
    weakref.WeakKeyDictionary()
)


def locked(
    key_template: KeyTemplate,
    *,
    using: str = DEFAULT_LOCK_ALIAS,
    timeout: float | None = None,
    lease: float | None = None,
    on_busy: OnBusy = DEFAULT_ON_BUSY,
    on_lost: OnLost = DEFAULT_ON_LOST,
    permits: int | None = None,
    max_hold: float | None = None,
    done_ttl: float | None = None,
    on_unavailable: OnUnavailable = DEFAULT_ON_UNAVAILABLE,
) -> Callable[[Callable[_P, _R]], Callable[_P, _R | SkippedResult]]:
    """Run the decorated task body under the lock named by ``key_template``.

    ``key_template`` is ``str.format``-ed with the call's signature-bound
    arguments (defaults applied), or is a callable taking them. ``using``,
    ``timeout``, ``lease``, ``on_busy``, ``on_lost``, ``permits``, ``max_hold``,
    ``done_ttl`` and ``on_unavailable`` are LockedTask's ``lock_using``,
    ``lock_timeout``, ``lock_lease``, ``on_busy``, ``on_lost``, ``lock_permits``,
    ``lock_max_hold``, ``lock_done_ttl`` and ``on_unavailable``.
    """

    def decorate(func: Callable[_P, _R]) -> Callable[_P, _R | SkippedResult]:
        if isinstance(func, Task | Proxy):
            raise TypeError(
                "put @locked under @app.task / @shared_task (it must wrap the task's "
                "function), or use base=LockedTask with lock=..."
            )
        options = TaskLockOptions.build(
            key_template,
            func,
            timeout=timeout,
            lease=lease,
            using=using,
            on_busy=on_busy,
            on_lost=on_lost,
            permits=permits,
            max_hold=max_hold,
            done_ttl=done_ttl,
            on_unavailable=on_unavailable,
        )

        @functools.wraps(func)
        def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R | SkippedResult:
            task = get_current_task()
            if task is not None and _body_of(task) is not wrapper:
                task = None  # called from inside some other task, not as this task's body
            app = task._get_app() if task is not None else get_current_app()
            return run_locked(
                options, func, args, kwargs, app=app, task=task, body=lambda: func(*args, **kwargs)
            )

        _locked_functions[wrapper] = options
        return wrapper

    return decorate


def run_task_body(
    task: Any, func: Callable[..., _R], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> _R | SkippedResult:
    """Run ``func`` as the body of ``task`` under its lock, as ``locked`` does inside a run.

    For a body decorated with ``django_rlock.locked``, which calls this when it
    finds itself running as a task: one decorator name, one behaviour.
    """
    options = options_of(task)
    if options is None:
        raise TypeError(f"task {task.name!r} does not run under a lock")
    return run_locked(
        options,
        func,
        args,
        kwargs,
        app=task._get_app(),
        task=task,
        body=lambda: func(*args, **kwargs),
    )


# The Django face's @locked hands a Celery task's body to this runner.
register_task_runner(run_task_body)


def _body_of(task: Any) -> object:
    run = task.run
    return getattr(run, "__func__", run)


def options_of(task: Any) -> TaskLockOptions | None:
    """The lock options a registered task runs under, or None for an unlocked task."""
    if hasattr(type(task), "lock_options"):
        # A LockedTask carries its own (None without a lock). Recognised by the
        # attribute it declares: celery_rlock._task builds on this module.
        options: TaskLockOptions | None = task.lock_options
        return options
    body = _body_of(task)
    if not callable(body):
        return None
    try:
        options = _locked_functions.get(body)
    except TypeError:  # not weak-referenceable: not one of ours
        return None
    spec = getattr(body, "__rlock_locked__", None)
    if options is None and isinstance(spec, LockedSpec):
        # Decorated with django_rlock.locked: the same options, on_busy by default.
        options = TaskLockOptions.build(
            spec.key_template,
            spec.func,
            timeout=spec.timeout,
            lease=spec.lease,
            using=spec.using,
            permits=spec.permits,
            max_hold=spec.max_hold,
        )
        _locked_functions[body] = options
    return options
