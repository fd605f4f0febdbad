"""The acquire loop as one plan, without I/O, driven by a sync and an asyncio shell.

:meth:`AcquirePlan.steps` is a generator that decides what to do next and
how long to wait; a shell performs each step and sends its result back:

* ``("attempt", waiter, sleep)``: one acquire script call, with the caller
  entered in the waiting set when ``waiter`` (``sleep``: its longest wait);
  the result is None when granted, else the seconds to wait at most (the
  holder's PTTL, see :func:`~django_rlock.core._protocol.calls.acquire_reply`).
* ``("listen",)``: subscribe to the lock's release channel.
* ``("wait_subscribed", timeout)``, ``("mark",)``, ``("wait", since, timeout)``:
  the subscription's own calls (see :class:`~django_rlock.core._sync.waiting.Subscription`).
  A wait that returns :data:`HANDED` ends the plan granted: the shell has
  recorded a grant the release handed it (a fair lock's handoff).
* ``("check_deadlock",)``: look for a wait-for cycle through the caller
  (:mod:`~django_rlock.core._protocol.deadlocks`); the shell raises
  :class:`~django_rlock.core.exceptions.DeadlockError` when the caller is the
  cycle's victim, else the plan goes on waiting.

The generator returns whether the lock was granted. Whatever happens (a
timeout, an error, a cancellation), the shell leaves the waiting set when
:attr:`AcquirePlan.registered` says the caller may be in it.

The rules: one attempt first; a non-blocking call or a zero wait stops there.
Otherwise the waiter subscribes, has the subscription confirmed *before* it
retries (so no release can slip between), and then sleeps until woken or the
holder's PTTL ends, whichever is first: never a fixed poll.

Deadlock checks (``deadlock_timeout``, None: none). A caller that has waited
that long checks, then once more soon after (:func:`second_look`), then again
every ``deadlock_timeout`` while it waits. The second look is for two members
of a cycle whose first checks ran the other way round (the later caller's
first, a loaded machine running the earlier one late): the victim's first
check found no cycle, as the other's edge was not written yet; without it, the
victim would find the cycle a whole ``deadlock_timeout`` later. A sleep
is cut short for a check only: after the check the caller sleeps on for what
was left of it, with no acquire call in between (the lock is never polled),
and a call that is granted or gives up sooner never checks at all.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Generator
from typing import Any

from django_rlock.core._protocol import clock

#: A step: the name of the call to make and its arguments.
Step = tuple[Any, ...]


#: What a wait returns when the lock was handed to the waiter and recorded.
HANDED = object()


#: The first attempt's result was not given: the plan sends that attempt itself.
NOT_SENT: Any = object()

#: Given as the first attempt's result: no attempt was sent, because the
#: caller's channels are subscribed and confirmed already (they linger from
#: its process's last wait for the lock, core/_protocol/channels.py). The
#: plan's first attempt is then a registered one, sent at once: a lock
#: contended in a loop costs one call less per wait.
SUBSCRIBED: Any = object()


#: The steps run on the subscription (the others on the shell).
_SUBSCRIPTION_CALLS = frozenset({"wait_subscribed", "mark", "wait"})


class AcquirePlan:
    """One acquire call's decisions: what to send next, how long to wait, when to give up."""

    def __init__(
        self,
        *,
        blocking: bool,
        wait: float | None,
        watchdog_timeout: float,
        deadlock_timeout: float | None = None,
    ) -> None:
        self.started = clock.monotonic()
        self.blocking = blocking
        self.deadline = math.inf if wait is None else self.started + wait
        self.zero_wait = wait == 0
        self.watchdog_timeout = watchdog_timeout
        #: The caller may be in the lock's waiting set (an attempt as a waiter
        #: was sent and did not bring a grant): the shell must leave it.
        self.registered = False
        #: Seconds between deadlock checks (None: the caller never checks).
        self.deadlock_timeout = deadlock_timeout
        #: When the next deadlock check is due (monotonic seconds).
        self.next_check = math.inf if deadlock_timeout is None else self.started + deadlock_timeout
        #: Deadlock checks made so far.
        self.checks = 0

    def steps(self, first: Any = NOT_SENT) -> Generator[Step, Any, bool]:
        """The plan; see the module's docstring for the steps and their results.

        ``first``: the result of the first attempt when the shell has already
        sent it (see :func:`drive`); the plan then goes on from there.
        """
        if first is SUBSCRIBED:
            # The holder's PTTL is not known yet: the first sleep is bounded by
            # the watchdog timeout, as every announced sleep is.
            pttl = self.watchdog_timeout
        else:
            pttl = (yield ("attempt", False, 0.0)) if first is NOT_SENT else first
            if pttl is None:
                return True
            if not self.blocking or self.zero_wait:
                return False
        yield ("listen",)
        while True:
            remaining = self.deadline - clock.monotonic()
            if remaining <= 0:
                return False
            yield ("wait_subscribed", min(pttl, remaining))
            since = yield ("mark",)
            self.registered = True
            # The waiting-set entry this attempt makes lives as long as the
            # sleep it announces (+ a margin): the sleep must never be longer,
            # or a release would find the entry gone and name nobody.
            announced = min(pttl, remaining, self.watchdog_timeout)
            pttl = yield ("attempt", True, announced)
            if pttl is None:
                self.registered = False  # the grant took it out of the waiting set
                return True
            remaining = self.deadline - clock.monotonic()
            if remaining <= 0:
                return False
            woken = yield from self._sleep(since, min(pttl, remaining, announced))
            if woken is HANDED:
                self.registered = False  # the handoff took it out of the queue
                return True

    def _sleep(self, since: Any, seconds: float) -> Generator[Step, Any, Any]:
        """One sleep of at most ``seconds`` (woken after ``since``), broken for deadlock checks.

        Returns what the ``wait`` step answered last. A checking caller's sleep
        ends at its next check at the latest; when it ended for the check (not
        woken, the sleep not over), the check runs and the sleep goes on for
        what is left. Without checks it is exactly one ``wait`` step.
        """
        every = self.deadlock_timeout
        if every is None:
            return (yield ("wait", since, seconds))
        end = clock.monotonic() + seconds
        while True:
            now = clock.monotonic()
            if now >= self.next_check:
                yield ("check_deadlock",)
                now = clock.monotonic()
                self.checks += 1
                self.next_check = now + (second_look(every) if self.checks == 1 else every)
            woken = yield ("wait", since, max(min(end, self.next_check) - now, 0.0))
            if woken or clock.monotonic() >= end:
                return woken


def second_look(deadlock_timeout: float) -> float:
    """Seconds from a caller's first deadlock check to its second: a tenth, at least 20 ms.

    Short enough that the victim of a cycle whose first checks ran in the
    other order finds it well within ``deadlock_timeout`` more; one extra
    check per long wait costs a waiter a few round trips, once.
    """
    return min(max(deadlock_timeout / 10, 0.02), deadlock_timeout)


def _target(shell: Any, step: Step) -> Callable[..., Any]:
    owner = shell.subscription if step[0] in _SUBSCRIPTION_CALLS else shell
    return getattr(owner, step[0])  # type: ignore[no-any-return]


def drive(plan: AcquirePlan, shell: Any, first: Any = NOT_SENT) -> bool:
    """Run ``plan`` with a sync shell (``attempt``, ``listen``, ``subscription``).

    ``first`` is the result of the plan's first step (``("attempt", False, 0.0)``)
    when the shell sent it before driving: an uncontended grant, the common
    case, then needs no generator at all.
    """
    if first is None:
        return True
    steps = plan.steps(first)
    try:
        step = next(steps)
        while True:
            step = steps.send(_target(shell, step)(*step[1:]))
    except StopIteration as done:
        return bool(done.value)


async def drive_async(plan: AcquirePlan, shell: Any, first: Any = NOT_SENT) -> bool:
    """Run ``plan`` with an asyncio shell; its calls may be coroutines.

    ``first``: the result of the first attempt, when the shell sent it (as for :func:`drive`).
    """
    if first is None:
        return True
    steps = plan.steps(first)
    try:
        step = next(steps)
        while True:
            reply = _target(shell, step)(*step[1:])
            step = steps.send(await reply if inspect.isawaitable(reply) else reply)
    except StopIteration as done:
        return bool(done.value)
