"""Who held each report lock the monitor saw: the worker process and task of each grant.

The monitor sees a report lock's grants from outside, by fencing token; each run
of ``build_report`` writes a ``Report`` row with the token it holds, its task id
and its worker process's pid, which name the grant's holder on the timeline.
"""

from __future__ import annotations

from demo.monitor import report_lock
from demo.timeline import Timeline
from orders.models import Report


def name_report_holders(timeline: Timeline) -> None:
    """Name the holder of every report grant on ``timeline`` from its ``Report`` row."""
    for report in Report.objects.select_related("customer"):
        timeline.name_holder(
            report_lock(report.customer.pk),
            report.fence,
            f"worker pid {report.worker_pid}, build_report {report.task_id[:8]}",
        )
