"""Holds a request took and did not give back: found as the request finishes.

A view that acquires a lock and returns without releasing it (an early
``return`` between ``acquire()`` and ``release()``, a forgotten ``release()``)
leaves the hold to its thread. A WSGI or ASGI worker thread lives on to serve
other requests, so the watchdog would renew that hold for as long as the
worker lives, and every other request for the lock would wait for ever.

Django sends ``request_started`` and ``request_finished`` around the request:
they begin and end its unit of work (:mod:`django_rlock.core._process.scopes`),
which covers every thread its code runs on (the WSGI thread, an ASGI
request's sync thread, ``sync_to_async(thread_sensitive=False)`` executor
threads, ``asyncio.to_thread``). When the request finishes, every hold
granted in it to a thread and still held is reported as leaked (an ERROR
naming the code that took it, the :data:`~django_rlock.signals.lock_leaked` signal, the
``django_rlock_leaked_total`` metric) and, with ``RLOCK_LEAKED = "release"``
(the default), given back; with ``"warn"`` it is no longer renewed and
expires by itself. Holds the thread had before the request started (a test
holding a lock around a test client call) are not the request's, and a hold
taken with a ``lease`` outlives the request by design (a throttle): the
thread then serves its next request under a new owner id, so that request
cannot re-enter it.

An async view's holds belong to its asyncio task, and are found as the task
finishes (:mod:`django_rlock.core._process.leaks`), as are a thread's when it ends.
"""

from __future__ import annotations

from typing import Any

from django.core.signals import request_finished, request_started

from django_rlock.core._faces import leaks


def _request_started(**_: Any) -> None:
    leaks.work_started("request")


def release_leaked_holds(**_: Any) -> None:
    """Report, and give back as configured, the holds the finishing request left behind."""
    leaks.work_ended("request")


request_started.connect(_request_started, dispatch_uid="django_rlock._requests.started")
request_finished.connect(release_leaked_holds, dispatch_uid="django_rlock._requests.finished")
