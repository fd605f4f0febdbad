"""Holds a request took and did not give back: found as the request finishes.

A view that acquires a lock and returns without releasing it (an early
``return`` between ``acquire()`` and ``release()``, a forgotten ``release()``)
leaves the hold to its thread. A WSGI or ASGI worker thread lives on to serve
other requests, so the watchdog would renew that hold for as long as the
worker lives, and every other request for the lock would wait for ever.

Django sends ``request_started`` and ``request_finished`` on the thread that
serves the request (the sync views' thread under ASGI). When the request
finishes, every hold its thread still has that was taken since the request
started is reported as leaked (an ERROR naming the code that took it, the
:data:`~django_rlock.signals.lock_leaked` signal, the
``django_rlock_leaked_total`` metric) and, with ``RLOCK_LEAKED = "release"``
(the default), given back; with ``"warn"`` it is no longer renewed and
expires by itself. Holds the thread had before the request started (a test
holding a lock around a test client call) are not the request's.

An async view's holds belong to its asyncio task, and are found as the task
finishes (:mod:`django_rlock.core.leaks`), as are a thread's when it ends.
"""

from __future__ import annotations

import threading
from typing import Any

from django.core.signals import request_finished, request_started

from django_rlock.core import clock, leaks
from django_rlock.core.hold import registries
from django_rlock.core.identity import thread_owner

__all__ = ["release_leaked_holds"]

_started = threading.local()


def _request_started(**_: Any) -> None:
    _started.at = clock.monotonic()


def release_leaked_holds(**_: Any) -> None:
    """Report, and give back as configured, the holds the finishing request left behind."""
    since: float | None = getattr(_started, "at", None)
    if since is None:
        return  # not a request this module saw begin
    _started.at = None
    owner = thread_owner()
    reason = "the request that took it finished without releasing it"
    for registry in registries():
        for hold in registry.holds_owned_by(owner):
            reported = hold.acquired_at >= since and registry.report_leaked(hold, reason)
            if reported and registry.release_leaked:
                leaks.give_back(hold)


request_started.connect(_request_started, dispatch_uid="django_rlock.requests.started")
request_finished.connect(release_leaked_holds, dispatch_uid="django_rlock.requests.finished")
