"""How long and how hard one run drives the shop: the full run and the quick one."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    """How long and how hard the demo drives the shop."""

    duration: float  # seconds of load
    watchdog: float  # RLOCK_WATCHDOG_TIMEOUT of every process
    report_seconds: float  # how long one report runs
    clients: int  # concurrent HTTP clients
    task_rate: float  # capture tasks sent per second
    customers: int = 3
    orders_per_customer: int = 4


FULL = Plan(duration=60, watchdog=2.0, report_seconds=10.0, clients=6, task_rate=4)
QUICK = Plan(duration=15, watchdog=1.5, report_seconds=6.0, clients=4, task_rate=4)
