"""Setting the shop up: a migrated, seeded database, a Celery worker and the dev server."""

from __future__ import annotations

import random
import time
from typing import Any

from django.core.management import call_command

from demo.console import Console
from demo.outcomes import Shop
from demo.plan import Plan
from demo.processes import Managed, free_port, start_server, start_worker, wait_http
from demo.session import Session
from orders.models import Customer, Order
from shop.celery import app


def start_shop(session: Session, env: dict[str, str], plan: Plan, console: Console) -> Shop:
    """Migrate and seed the database, start the worker and the server; wait until both answer."""
    call_command("migrate", verbosity=0)
    customers, orders = seed(plan)
    console.say(f"database migrated and seeded: {session.data_dir / 'shop.sqlite3'}")
    session.app = app
    worker = start_worker(
        env, session.data_dir / "worker.log", session.nodename, queue=session.namespace
    )
    session.processes.append(worker)
    port = free_port()
    server = start_server(env, session.data_dir / "server.log", port)
    session.processes.append(server)
    wait_http(f"http://127.0.0.1:{port}/orders/{orders[0]}/", server, 60)
    console.say(f"Django server answering on http://127.0.0.1:{port}/ (pid {server.pid})")
    wait_worker_ready(worker, app, session.nodename, 60)
    console.say(
        f"Celery worker ready (prefork, 2 processes, pid {worker.pid}); "
        f"watchdog timeout {plan.watchdog:g}s"
    )
    return Shop(port=port, customers=customers, orders=orders, worker_pid=worker.pid)


def seed(plan: Plan) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Create the customers and their orders; their primary keys."""
    rng = random.Random(8)
    customers, orders = [], []
    for number in range(1, plan.customers + 1):
        customer = Customer.objects.create(name=f"customer {number}")
        customers.append(customer.pk)
        for _ in range(plan.orders_per_customer):
            total = rng.randint(50, 200) * 100
            orders.append(Order.objects.create(customer=customer, total=total, balance=total).pk)
    return tuple(customers), tuple(orders)


def wait_worker_ready(worker: Managed, celery_app: Any, nodename: str, timeout: float) -> None:
    """Wait until the worker answers a ping; fail if it exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not worker.running():
            raise RuntimeError(f"the Celery worker exited at start:\n{worker.tail()}")
        if celery_app.control.ping(destination=[nodename], timeout=0.5):
            return
    raise RuntimeError(f"the Celery worker was not ready in {timeout}s:\n{worker.tail()}")
