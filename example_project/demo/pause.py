"""Scenario: a holder pauses past its lease (as in a long GC), then writes with its old token.

Meanwhile a request takes the order's lock and pays. The holder's late write
carries a lower fencing token than the request's, so the order refuses it, and
its ``release()`` raises ``LockLostError``. Both holds, the pause, the lease
running out, the refused write and the failed release go on the run's timeline.
"""

from __future__ import annotations

import dataclasses
import os
import threading

from django.db import connection
from django_rlock import rlock
from django_rlock.core import RLock
from django_rlock.exceptions import LockLostError

from demo.console import Console
from demo.load import post_json
from demo.outcomes import Pause
from demo.plan import Plan
from demo.timeline import Timeline
from orders.models import Entry, Order, StaleFenceError


def pause_holder(
    order_id: int, *, port: int, plan: Plan, timeline: Timeline, console: Console
) -> Pause:
    """Hold ``order_id``'s lock with a lease of one watchdog timeout, overstay it, write late."""
    pause = Pause(order=order_id, lease=plan.watchdog)
    name = Order.lock_name(order_id)
    try:
        lock = rlock(name)
        if not lock.acquire(timeout=10, lease=pause.lease):
            raise RuntimeError(f"could not take {name}")
        taken = timeline.now()
        try:
            pause = dataclasses.replace(pause, token=lock.token or 0)
            holder = f"the demo (pid {os.getpid()}), thread {threading.current_thread().name}"
            timeline.held(name, pause.token, taken, taken + pause.lease, holder)
            timeline.mark(name, pause.token, "paused", "pauses", taken)
            timeline.mark(name, pause.token, "expired", "lease ran out", taken + pause.lease)
            order = Order.objects.get(pk=order_id)
            console.say(
                f"a holder of {name} (token {pause.token}, lease {pause.lease:g}s) "
                "pauses, as in a long GC..."
            )
            # Meanwhile a request comes for the order: it gets the lock
            # once the lease has run out, and pays.
            answer = post_json(port, f"/orders/{order_id}/pay/", {"amount": 100})
            pause = dataclasses.replace(pause, overtaken_by=int(answer["fence"]))
            record_request(timeline, order_id, pause.overtaken_by)
            try:
                order.pay(100, lock=lock, source="paused")
            except StaleFenceError:
                pause = dataclasses.replace(pause, refused=True)
                timeline.mark(name, pause.token, "refused", f"write refused (token {pause.token})")
            console.say(
                f"...it wakes up and writes with token {pause.token} after a request "
                f"wrote with token {pause.overtaken_by}: "
                + ("refused by the fence" if pause.refused else "ACCEPTED")
            )
        finally:
            pause = dataclasses.replace(pause, release_raised=release_stale(lock))
            if pause.release_raised:
                timeline.mark(name, pause.token, "lost", f"release(): {pause.release_raised}")
    except Exception as error:  # noqa: BLE001 -- reported as a failed check
        pause = dataclasses.replace(pause, error=f"{type(error).__name__}: {error}")
        console.say(f"the paused-holder scenario failed: {pause.error}")
    finally:
        connection.close()
    return pause


def record_request(timeline: Timeline, order_id: int, token: int) -> None:
    """Put the request that took the lock meanwhile on the timeline, as its ledger line has it."""
    entry = Entry.objects.get(order_id=order_id, fence=token)
    timeline.held(
        Order.lock_name(order_id),
        token,
        timeline.at_wall(entry.held_from),
        timeline.at_wall(entry.held_until),
        f"web request POST /orders/{order_id}/pay/ ({entry.source})",
    )


def release_stale(lock: RLock) -> str:
    """Release the overstayed lock: the name of the LockLostError it raised, or ""."""
    try:
        lock.release()
    except LockLostError as error:
        return type(error).__name__
    return ""
