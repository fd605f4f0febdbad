"""The load phase: HTTP clients, capture tasks and reports, with the two scenarios on a schedule.

For ``plan.duration`` seconds, ``plan.clients`` HTTP clients pay, refund and read
random orders and a producer sends ``plan.task_rate`` capture tasks a second;
reports are queued through the API at fixed fractions of the run, one of them
twice, one of them to have its worker process SIGKILLed (:mod:`demo.kill`), and
at two thirds a holder overstays its lease (:mod:`demo.pause`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from demo.console import Console
from demo.kill import kill_report_holder
from demo.load import HttpClient, HttpStats, TaskProducer, post_json
from demo.monitor import RenewalMonitor
from demo.outcomes import Kill, Load, Pause, Shop
from demo.pause import pause_holder
from demo.plan import Plan
from demo.session import Session
from orders.models import Report
from orders.tasks import capture_payment

#: How long to wait for each thread of the load once it is told to stop (seconds).
JOIN_TIMEOUT = 40

#: The error of a scenario still running after JOIN_TIMEOUT.
UNFINISHED = f"the scenario did not end within {JOIN_TIMEOUT}s of the load"

T = TypeVar("T")


class Background(Generic[T]):
    """A function run once on a daemon thread (a stuck one must not hold up the exit)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.value: T | None = None
        self.thread: threading.Thread | None = None

    def start(self, target: Callable[[], T]) -> None:
        def run() -> None:
            self.value = target()

        self.thread = threading.Thread(target=run, name=self.name, daemon=True)
        self.thread.start()

    def result(self, timeout: float) -> T | None:
        """Its return value; None if it never started or is still running after ``timeout``."""
        if self.thread is not None:
            self.thread.join(timeout)
        return self.value


class ReportQueue:
    """Queues customers' reports through the shop's API and remembers their tasks."""

    def __init__(self, port: int, seconds: float, console: Console) -> None:
        self.port = port
        self.seconds = seconds
        self.console = console
        self.tasks: list[tuple[int, str]] = []  # (customer, task id)

    def queue(self, customer: int, note: str = "") -> str:
        answer = post_json(self.port, f"/customers/{customer}/report/", {"seconds": self.seconds})
        task_id = str(answer["task"])
        self.tasks.append((customer, task_id))
        self.console.say(f"report of customer {customer} queued through the API{note}")
        return task_id


def drive(
    shop: Shop, monitor: RenewalMonitor, session: Session, plan: Plan, console: Console
) -> Load:
    """Drive the shop for ``plan.duration`` seconds; return once the load's threads are done."""
    console.say(
        f"driving for {plan.duration:g}s: {plan.clients} HTTP clients (pay, refund, read), "
        f"{plan.task_rate:g} capture tasks/s, reports of {plan.report_seconds:g}s"
    )
    stop = threading.Event()
    http = HttpStats()
    sent: list[Any] = []  # AsyncResults of the capture tasks
    reports = ReportQueue(shop.port, plan.report_seconds, console)
    orders = list(shop.orders)
    clients = [HttpClient(shop.port, orders, http, stop, seed) for seed in range(plan.clients)]
    producer = TaskProducer(capture_payment, orders, plan.task_rate, stop, results=sent, seed=99)
    victim, paused_order = shop.customers[1], shop.orders[0]
    kill_run: Background[Kill] = Background("kill-scenario")
    pause_run: Background[Pause] = Background("pause-scenario")

    def start_kill() -> None:
        task_id = reports.queue(victim, " (its worker process will be SIGKILLed)")
        kill_run.start(
            lambda: kill_report_holder(
                victim,
                task_id,
                worker_pid=shop.worker_pid,
                monitor=monitor,
                plan=plan,
                console=console,
            )
        )

    def start_pause() -> None:
        pause_run.start(
            lambda: pause_holder(
                paused_order, port=shop.port, plan=plan, timeline=monitor.timeline, console=console
            )
        )

    schedule: list[tuple[float, Callable[[], object]]] = [
        (0.02, lambda: reports.queue(shop.customers[0])),
        (0.05, lambda: reports.queue(shop.customers[0], " (a duplicate: busy, retried)")),
        (0.25, start_kill),
        (0.5, lambda: reports.queue(shop.customers[2])),
        (0.65, start_pause),
    ]
    for thread in [*clients, producer]:
        thread.start()
    try:
        run_schedule(
            schedule, session, plan, console, lambda: progress_text(http, sent, reports, monitor)
        )
    finally:
        stop.set()
        # Their results live outside the run's namespace: the session deletes them.
        session.task_ids += [result.id for result in sent] + [t for _, t in reports.tasks]
    console.end_progress()
    console.say("load stopped; waiting for the tasks and reports in flight")
    for thread in [*clients, producer]:
        thread.join(JOIN_TIMEOUT)
    return Load(
        http=http.totals(),
        capture_ids=tuple(result.id for result in sent),
        report_tasks=tuple(reports.tasks),
        kill=kill_run.result(JOIN_TIMEOUT) or Kill(victim, "", error=UNFINISHED),
        pause=pause_run.result(JOIN_TIMEOUT) or Pause(paused_order, error=UNFINISHED),
    )


def run_schedule(
    schedule: list[tuple[float, Callable[[], object]]],
    session: Session,
    plan: Plan,
    console: Console,
    progress: Callable[[], str],
) -> None:
    """Run each step at its fraction of ``plan.duration``, show progress, watch the processes."""
    begin = time.monotonic()
    end = begin + plan.duration
    next_progress = begin
    while (now := time.monotonic()) < end:
        while schedule and now - begin >= schedule[0][0] * plan.duration:
            schedule.pop(0)[1]()
        if now >= next_progress:
            console.progress(progress())
            next_progress = now + (1.0 if console.tty else max(plan.duration / 12, 2.0))
        session.check_alive()
        time.sleep(0.05)


def progress_text(
    http: HttpStats, sent: list[Any], reports: ReportQueue, monitor: RenewalMonitor
) -> str:
    finished = Report.objects.filter(finished_at__isnull=False).count()
    return (
        f"HTTP {http.served:,} answered ({http.statuses[409]:,} x 409)  "
        f"tasks sent {len(sent):,}  "
        f"reports {finished}/{len(reports.tasks)} done  "
        f"renewals seen {monitor.renewals()}"
    )
