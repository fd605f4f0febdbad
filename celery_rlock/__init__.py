"""celery_rlock: Celery tasks that run under a watchdog-renewed distributed lock.

Two ways to lock a task; both take the lock when the run starts (not when the
task is sent) and release it in a ``finally`` around the body, so success,
failure, ``self.retry()``, ``Ignore``, ``Reject`` and soft time limits all
release it at once::

    from celery_rlock import LockedTask, locked

    @app.task(base=LockedTask, lock="report:{customer_id}")
    def build_report(customer_id): ...

    @app.task(bind=True)
    @locked("order:{order_id}", on_busy="wait", timeout=30)
    def charge(self, order_id): ...

Keys are formatted from the signature-bound arguments with defaults applied, so
``build_report.delay(7)`` and ``build_report.delay(customer_id=7)`` lock the
same name; a key that cannot be formatted fails the run with a clear
ValueError, and keys longer than a lock name may be are hashed, not cut.

When the lock is busy, ``on_busy`` decides (``lock_timeout`` / ``timeout`` is
how long to wait first; by default only ``"wait"`` waits):

``"retry"`` (default)
    Re-queue with ``self.retry(countdown=<holder's remaining lease>)``; after
    the task's ``max_retries`` the run fails with LockTimeout.
``"skip"``
    Finish without running: the result is ``{"skipped": True, "reason":
    "lock busy", "lock": <name>}`` and the log says so.
``"wait"``
    Block up to ``lock_timeout`` (None: as long as it takes), then retry as above.
``"raise"``
    Fail with :class:`~django_rlock.core.LockTimeout` (``retry_after`` = the
    holder's remaining lease).

While a run holds its lock, ``self.request.rlock`` holds its name, fencing
``token`` and wait time; the log lines of the task show the wait and the hold
time. If a worker dies (SIGKILL, hard time limit, ``revoke(terminate=True)``,
lost machine), its locks are not renewed any more and expire within the
watchdog timeout (default 30 s).

``once=True`` (LockedTask only) deduplicates at enqueue time: ``apply_async``
raises :class:`AlreadyQueued` (or, with ``once_on_duplicate="return"``,
returns the existing AsyncResult) while an equal task is queued or running.

Configuration: inside a Django project, ``RLOCKS`` / ``RLOCK_*`` via
``django_rlock.locks[lock_using]``; without Django, the Celery settings
``rlock_url`` (default: ``broker_url`` when it is Redis), ``rlock_key_prefix``
and ``rlock_watchdog_timeout``. See :mod:`celery_rlock._conf`. The worker checks
them at start, and refuses the gevent and eventlet pools (ConfigurationError).
"""

from celery_rlock._conf import ConfigurationError
from celery_rlock._decorators import locked
from celery_rlock._guard import SkippedResult, TaskLock
from celery_rlock._once import AlreadyQueued
from celery_rlock._task import LockedTask

__all__ = [
    "AlreadyQueued",
    "ConfigurationError",
    "LockedTask",
    "SkippedResult",
    "TaskLock",
    "locked",
]
