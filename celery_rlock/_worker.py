"""Worker lifecycle wiring: checks at worker start, ``once`` markers of revoked tasks.

* A worker bootstep checks, before the pool starts, that the lock settings of
  its locked and rate-limited tasks are usable and that the pool can keep
  locks alive; a problem stops the worker
  with "Unrecoverable error" instead of failing its first task. (A signal
  receiver cannot do this: Celery logs and swallows receiver exceptions.)
* Green pools (gevent, eventlet) are refused: the watchdog would be a
  greenlet, and a task that does not yield (CPU work, blocking C code) would
  starve it until its locks expire under the running task.
* Prefork children need nothing: each builds its own client on first use, the
  core regenerates the owner id after fork, and the child's watchdog starts
  with its first lock. A child killed by SIGKILL or by the hard time limit
  simply stops renewing, so its locks expire within the watchdog timeout.
* Warm shutdown waits for running tasks, whose ``finally`` releases their locks.
* Every task run, locked or not, is a unit of work whose holds end with it
  (:mod:`django_rlock._scopes.taskruns`, wired by the Django app too): a hold the
  body took and kept is reported and given back as the run ends, so the next
  task on the same child (same thread, same owner id) cannot re-enter it.

(A task revoked or expired before it ran frees its ``once`` marker: see
:mod:`celery_rlock._task`.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery import bootsteps
from celery.signals import worker_init

from celery_rlock._conf import ConfigurationError, check_configuration
from celery_rlock._decorators import options_of
from celery_rlock._ratelimit import RateOptions
from django_rlock._celeryface import wire_task_runs

if TYPE_CHECKING:
    from celery import Celery

    from celery_rlock._guard import TaskLockOptions

_GREEN_POOLS = ("gevent", "eventlet")


def locked_tasks(app: Celery) -> dict[str, TaskLockOptions]:
    """The lock options of every task of ``app`` that runs under a lock, by task name."""
    found = {}
    for name, task in app.tasks.items():
        options = options_of(task)
        if options is not None:
            found[name] = options
    return found


def rate_limit_aliases(app: Celery) -> set[str]:
    """The lock aliases whose rate limiters the tasks of ``app`` use (``lock_rate``)."""
    found = set()
    for task in app.tasks.values():
        options = getattr(task, "rate_options", None)
        if isinstance(options, RateOptions):
            found.add(options.using)
    return found


def check_pool(pool_cls: object) -> None:
    """Raise ConfigurationError for a pool under which renewal is not sound."""
    module = getattr(pool_cls, "__module__", "") or ""
    for green in _GREEN_POOLS:
        if module == f"celery.concurrency.{green}":
            raise ConfigurationError(
                f"celery_rlock does not support the {green} pool: its lock watchdog would "
                "be a greenlet, and a task that does not yield (CPU-bound, or blocking C "
                "code) would starve it until the task's lock expired while it still ran. "
                "Use --pool=prefork (or threads, or solo)."
            )


class LockStep(bootsteps.Step):  # type: ignore[misc]  # Celery ships no type hints
    """Checks the lock configuration when the worker is built, before its pool starts."""

    name = "celery_rlock._worker.LockStep"
    label = "rlock"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        tasks = locked_tasks(worker.app)
        # A rate-limited task needs its lock server as much as a locked one,
        # though it has no watchdog for a green pool to starve.
        aliases = {options.using for options in tasks.values()} | rate_limit_aliases(worker.app)
        if tasks:
            check_pool(worker.pool_cls)
        if aliases:
            check_configuration(worker.app, aliases)


def install(app: Celery) -> None:
    """Add the worker checks to ``app`` (idempotent; LockedTask and locked call it)."""
    app.steps["worker"].add(LockStep)


def _on_worker_init(sender: Any = None, **kwargs: Any) -> None:
    # Sent before the worker builds its blueprint: the step is in time even for
    # an app whose locked tasks are only bound when the worker finalizes it.
    install(sender.app)


worker_init.connect(_on_worker_init, weak=False)


# Every task run is a unit of work whose holds end with it (django_rlock._scopes.taskruns).
wire_task_runs()
