"""A request is a scope: what ends with it, and what does not (docs/guarantees.md, Ownership).

A hold granted while a request runs, on whatever thread its code runs
(an ASGI request's ``sync_to_async(thread_sensitive=False)`` helper on a thread of
asgiref's pool included), ends with the request if it is still held: reported
and given back. A hold taken with a lease is a lease: it outlives the request
by design (a throttle), is never reported, and the next request served by the
same thread cannot re-enter it.
"""

from __future__ import annotations

import http.client
import json
import os
import time
from pathlib import Path
from typing import Any

import redis
from django.test import Client

from django_rlock import locks
from tests.children import python_module, read_answer
from tests.django.conftest import HANG, Heard

ROOT = Path(__file__).resolve().parents[2]


def test_a_lease_throttle_outlives_its_request_and_holds_off_the_next(
    leaked: Heard, r: redis.Redis
) -> None:
    client = Client()  # every request on this thread, as a sync worker serves them
    assert client.get("/throttled/report/").content == b"did it"
    lock = locks["default"].lock("report")
    # The lease runs on after the request: not a leak, not given back.
    assert lock.locked()
    assert 0 < lock.ttl() <= 4.0  # type: ignore[operator]
    assert leaked.calls == []
    # The next request, same thread: it must not re-enter the first one's hold.
    answer = client.get("/throttled/report/")
    assert answer.status_code == 429
    assert leaked.calls == []


def test_an_asgi_requests_executor_thread_hold_ends_with_the_request(
    rlocks: dict[str, Any],
) -> None:
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    config = {"asgi": True, "settings": {"RLOCKS": {"default": rlocks["default"]}}}
    with python_module("tests.django.wsgi_worker", json.dumps(config), cwd=ROOT, env=env) as server:
        port = int(read_answer(server)["port"])
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=HANG)
        try:
            connection.request("GET", "/leaky-executor/executor-leak/")
            response = connection.getresponse()
            assert (response.status, response.read()) == (200, b"took it")
        finally:
            connection.close()
        # The request finished: its hold is given back (the watchdog timeout is
        # 5 s, and before, the hold was renewed for the server's whole life).
        lock = locks["default"].lock("executor-leak")
        deadline = time.monotonic() + 3.0
        while lock.locked() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not lock.locked()
