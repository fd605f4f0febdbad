"""The load: HTTP clients of the shop's API and a producer of capture tasks."""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from celery.exceptions import TimeoutError as ResultTimeout

from demo.outcomes import HttpTotals

#: What a client thread does, with its weight.
OPERATIONS = (("pay", 5), ("refund", 4), ("read", 1))


@dataclass
class HttpStats:
    """What the HTTP clients saw, by outcome."""

    statuses: Counter[int] = field(default_factory=Counter)
    conflicts_without_retry_after: int = 0
    failures: int = 0
    errors: list[str] = field(default_factory=list)
    mutex: threading.Lock = field(default_factory=threading.Lock)

    @property
    def served(self) -> int:
        return sum(self.statuses.values())

    def record(self, status: int, retry_after: str | None) -> None:
        with self.mutex:
            self.statuses[status] += 1
            if status == 409 and not (retry_after or "").isdigit():
                self.conflicts_without_retry_after += 1

    def error(self, text: str) -> None:
        with self.mutex:
            self.failures += 1
            if len(self.errors) < 20:
                self.errors.append(text)

    def totals(self) -> HttpTotals:
        """What was seen so far, as the load phase's outcome."""
        with self.mutex:
            return HttpTotals(
                served=self.served,
                by_status={str(status): count for status, count in self.statuses.items()},
                conflicts_without_retry_after=self.conflicts_without_retry_after,
                errors=self.failures,
                first_errors=tuple(self.errors[:5]),
            )


class HttpClient(threading.Thread):
    """One keep-alive connection sending pay / refund / read requests until stopped."""

    def __init__(
        self, port: int, orders: list[int], stats: HttpStats, stop: threading.Event, seed: int
    ) -> None:
        super().__init__(name=f"http-client-{seed}", daemon=True)
        self.port = port
        self.orders = orders
        self.stats = stats
        self.stop_event = stop
        self.random = random.Random(seed)

    def run(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        names = [name for name, _ in OPERATIONS]
        weights = [weight for _, weight in OPERATIONS]
        try:
            while not self.stop_event.is_set():
                order = self.random.choice(self.orders)
                operation = self.random.choices(names, weights)[0]
                try:
                    status, retry_after = self.send(connection, operation, order)
                except (OSError, http.client.HTTPException) as error:
                    self.stats.error(f"{operation} order {order}: {error!r}")
                    connection.close()
                    continue
                self.stats.record(status, retry_after)
        finally:
            connection.close()

    def send(
        self, connection: http.client.HTTPConnection, operation: str, order: int
    ) -> tuple[int, str | None]:
        if operation == "read":
            connection.request("GET", f"/orders/{order}/")
        else:
            body = json.dumps({"amount": self.random.randint(100, 3000)})
            connection.request(
                "POST",
                f"/orders/{order}/{operation}/",
                body=body,
                headers={"Content-Type": "application/json"},
            )
        response = connection.getresponse()
        response.read()
        if response.status not in (200, 409):
            self.stats.error(f"{operation} order {order}: HTTP {response.status}")
        return response.status, response.getheader("Retry-After")


def post_json(port: int, path: str, payload: dict[str, Any], timeout: float = 30) -> Any:
    """POST ``payload`` to the shop; the decoded answer (raises on a non-2xx status)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request(
            "POST", path, body=json.dumps(payload), headers={"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        body = response.read()
        if not 200 <= response.status < 300:
            raise RuntimeError(f"POST {path}: HTTP {response.status}: {body[:200]!r}")
        return json.loads(body)
    finally:
        connection.close()


class TaskProducer(threading.Thread):
    """Sends ``capture_payment`` tasks for random orders, ``rate`` per second, until stopped."""

    def __init__(
        self,
        task: Any,
        orders: list[int],
        rate: float,
        stop: threading.Event,
        *,
        results: list[Any],
        seed: int,
    ) -> None:
        """``results`` receives the AsyncResult of every task sent."""
        super().__init__(name="task-producer", daemon=True)
        self.task = task
        self.orders = orders
        self.interval = 1 / rate
        self.stop_event = stop
        self.results = results
        self.random = random.Random(seed)

    def run(self) -> None:
        while not self.stop_event.wait(self.interval):
            order = self.random.choice(self.orders)
            self.results.append(self.task.delay(order, self.random.randint(100, 2000)))


def wait_results(results: list[Any], timeout: float) -> tuple[list[Any], int]:
    """The values of the finished ``results`` and how many did not finish within ``timeout``."""
    deadline = time.monotonic() + timeout
    values = []
    unfinished = 0
    for result in results:
        remaining = deadline - time.monotonic()
        try:
            values.append(result.get(timeout=max(remaining, 0.01), propagate=False))
        except ResultTimeout:
            unfinished += 1
    return values, unfinished
