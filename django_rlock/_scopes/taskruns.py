"""Every Celery task run is a unit of work whose holds end with it.

A hold a task body took and kept would otherwise be renewed for as long as
the worker's child lives, and re-entered by the next task the child runs on
the same thread (same owner id). So ``task_prerun`` begins a unit of work and
``task_postrun`` ends it (:func:`django_rlock.core._process.leaks.work_started`
/ ``work_ended``): what the run kept is reported and given back.

Wired by :func:`wire_task_runs`, from whichever side sees Celery first: the Django app
as it becomes ready, when the project has imported Celery (a worker always
has; ``celery_rlock`` need not be imported), and ``celery_rlock`` as it is
imported. Connecting twice is harmless (one ``dispatch_uid``).
"""

from __future__ import annotations

from typing import Any

from django_rlock.core._faces import leaks


def _task_run_started(**_: Any) -> None:
    leaks.work_started("task run")


def _task_run_ended(**_: Any) -> None:
    leaks.work_ended("task run")


def wire_task_runs() -> None:
    """Connect the task-run receivers to Celery's signals (idempotent)."""
    # Deferred: Celery is optional for django_rlock, and costs ~0.1 s to import.
    from celery.signals import task_postrun, task_prerun  # noqa: PLC0415

    # Sent on the thread that runs the task (in the pool's child, or the
    # caller's for an eager run), before and after it, whatever its outcome.
    task_prerun.connect(_task_run_started, weak=False, dispatch_uid="django_rlock.task_run.start")
    task_postrun.connect(_task_run_ended, weak=False, dispatch_uid="django_rlock.task_run.end")
