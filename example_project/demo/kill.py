"""Scenario: SIGKILL the worker process holding a report lock; time how long its lock outlives it.

The holder dies without releasing; its watchdog dies with it, so the lock must
expire within the watchdog timeout. Celery puts the task back in the queue
(``acks_late``, ``reject_on_worker_lost``); its next run retries until then.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time

from django.db import connection
from django_rlock import locks

from demo.console import Console
from demo.monitor import RenewalMonitor, report_lock
from demo.outcomes import Kill
from demo.plan import Plan
from orders.models import Report


def kill_report_holder(
    customer: int,
    task_id: str,
    *,
    worker_pid: int,
    monitor: RenewalMonitor,
    plan: Plan,
    console: Console,
) -> Kill:
    """Wait until report ``task_id`` runs and its lock was renewed twice, SIGKILL its process."""
    name = report_lock(customer)
    kill = Kill(customer=customer, task_id=task_id)
    try:
        deadline = time.monotonic() + plan.duration
        report = wait_for_run(task_id, deadline)
        # Let it hold the lock past a few renewals first.
        held = wait_for_renewals(monitor, name, report.fence, deadline)
        if os.getpgid(report.worker_pid) != worker_pid:
            raise RuntimeError(f"pid {report.worker_pid} is not a process of our worker")
        os.kill(report.worker_pid, signal.SIGKILL)
        kill = dataclasses.replace(
            kill,
            pid=report.worker_pid,
            token=report.fence,
            held_before_kill=held,
            killed_at=time.monotonic(),
        )
        timeline = monitor.timeline
        killed = timeline.at_monotonic(kill.killed_at)
        timeline.mark(name, kill.token, "sigkill", f"SIGKILL pid {kill.pid}", killed)
        console.say(
            f"SIGKILL -> worker process {kill.pid}, holding {name} (token {kill.token}) "
            f"for {kill.held_before_kill:.1f}s"
        )
        limit = 3 * plan.watchdog
        kill = dataclasses.replace(kill, freed_after=wait_until_freed(name, kill, limit))
        if kill.freed_after is None:
            console.say(f"{name} still held {limit:g}s after the kill")
        else:
            freed = killed + kill.freed_after
            timeline.mark(name, kill.token, "freed", f"freed +{kill.freed_after:.2f}s", freed)
            timeline.ended(name, kill.token, freed)
            console.say(
                f"{name} freed {kill.freed_after:.2f}s after the kill "
                f"(watchdog timeout {plan.watchdog:g}s); the task goes round again"
            )
    except Exception as error:  # noqa: BLE001 -- reported as a failed check
        kill = dataclasses.replace(kill, error=f"{type(error).__name__}: {error}")
        console.say(f"killing a report run failed: {kill.error}")
    finally:
        connection.close()
    return kill


def wait_for_run(task_id: str, deadline: float) -> Report:
    """The ``Report`` row of task ``task_id``, once its run has started."""
    while time.monotonic() < deadline:
        report = Report.objects.filter(task_id=task_id).first()
        if report is not None:
            return report
        time.sleep(0.05)
    raise RuntimeError("the report to kill never started")


def wait_for_renewals(monitor: RenewalMonitor, name: str, token: int, deadline: float) -> float:
    """How long the grant ``token`` was held once renewed twice (0.0 if not by ``deadline``)."""
    while time.monotonic() < deadline:
        watch = monitor.watch(name, token)
        if watch is not None and watch.renewals >= 2:
            return time.monotonic() - watch.first_seen
        time.sleep(0.02)
    return 0.0


def wait_until_freed(name: str, kill: Kill, limit: float) -> float | None:
    """Seconds from the kill until ``name`` is no longer the killed grant; None after ``limit``."""
    backend = locks["default"]
    while time.monotonic() - kill.killed_at < limit:
        info = backend.inspect(name)
        if info is None or info.token != kill.token:
            return time.monotonic() - kill.killed_at
        time.sleep(0.005)
    return None
