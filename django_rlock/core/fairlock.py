"""FairLock: an RLock granted in arrival order (Redisson's RFairLock).

Everything of :class:`~django_rlock.core.lock.RLock` holds (reentrant, owner
per thread, watchdog or lease, fencing token, ``lost`` and ``on_lost``, lost
replies, holder metadata); what changes is who gets the lock when it is
free: the caller that has waited longest, never a newcomer that happens to
retry first::

    client = LockClient("redis://127.0.0.1:6379/0")
    lock = client.fair_lock("report:42")
    with lock:                    # waits its turn, behind earlier callers
        build(report, fence=lock.token)

A caller's turn is the order of its first busy attempt. A waiter that gives up
(its timeout ran out) leaves the queue at once; one that died or stopped
retrying is skipped once its entry expires, at most the watchdog timeout and
half a second after its last attempt. A non-blocking ``acquire`` (or a zero
timeout) never queues, and is refused while anyone is queued. The scripts and
key layout are in :mod:`django_rlock.core.fairlock_scripts`.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from typing import TYPE_CHECKING, Unpack

from django_rlock.core import clock
from django_rlock.core.calls import ScriptCall
from django_rlock.core.fairlock_scripts import (
    FairKeys,
    fair_abandon_call,
    fair_keys,
    with_queue,
)
from django_rlock.core.identity import thread_owner
from django_rlock.core.lock import LockBase, LockOptions, RLock
from django_rlock.core.plan import AcquirePlan, drive

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from django_rlock.core.client import LockClient
    from django_rlock.core.waiting import Subscription

__all__ = ["FairBase", "FairLock", "sleep_cap"]

logger = logging.getLogger("django_rlock.lock")

#: The shortest sleep a queued waiter announces, in seconds (its deadline is near).
_MIN_SLEEP = 0.001


def sleep_cap(plan: AcquirePlan) -> float:
    """The longest a queued waiter of ``plan`` sleeps before its next attempt, in seconds.

    The fair script makes the waiter's entry outlive this sleep, so it must be
    short enough that a waiter that dies stalls the queue for no longer than
    the watchdog timeout, and no longer than the caller's own wait.
    """
    remaining = plan.deadline - clock.monotonic()
    return max(min(plan.watchdog_timeout, remaining), _MIN_SLEEP)


class FairBase(LockBase):
    """What :class:`FairLock` and the asyncio ``AsyncFairLock`` share: keys and script calls.

    Put before the RLock class it extends (``class FairLock(FairBase, RLock)``),
    it turns the plain calls into the fair scripts' (see :func:`with_queue`).
    """

    #: The fair lock's keys (also :attr:`keys`), with its queue.
    fair_keys: FairKeys

    def _fair_setup(self) -> None:
        """Point the lock at the fair keys; refuse what a fair lock cannot do."""
        engine = self._engine
        if engine.min_replicas:
            raise ValueError(
                f"fair_lock({self.name!r}) does not support min_replicas "
                f"(the client has min_replicas={engine.min_replicas}): a fair grant "
                "undone for want of replicas would have to give the head its turn back; "
                "use a client with min_replicas=0 for fair locks"
            )
        self.fair_keys = fair_keys(engine.key_prefix, self.name)
        self.keys = self.fair_keys

    def _acquire_call(
        self, owner: str, lease: float | None, waiter_id: str, sleep: float
    ) -> ScriptCall:
        """The plain acquire call on the fair keys, plus the queue (``waiter_id``: queue id)."""
        return with_queue(super()._acquire_call(owner, lease, waiter_id, sleep), self.fair_keys)

    def _release_call(self, owner: str) -> ScriptCall:
        """The plain release call on the fair keys, plus the queue."""
        return with_queue(super()._release_call(owner), self.fair_keys)

    def _abandon_call(self, queue_id: str) -> ScriptCall:
        return fair_abandon_call(self.fair_keys, queue_id, self._engine.publish_command)

    def _queue_id(self, plan: AcquirePlan, new_waiter_id: Callable[[], str]) -> str:
        """The caller's place in the queue for one acquire call ('' when it will not wait).

        The plan's first attempt is sent before the caller subscribes, yet it
        is the one that must take the caller's place (arrival order is the
        order of first busy attempts). So the id is a waiter id taken from the
        listener before that attempt, and the subscription is then made under
        the same id: a release that names the head wakes that very waiter.
        An id per acquire call (not the owner id) also keeps owner ids, the
        holders' credentials, off the release channel.
        """
        return new_waiter_id() if plan.blocking and not plan.zero_wait else ""


class FairLock(FairBase, RLock):
    """A reentrant lock granted in arrival order; get one from :meth:`LockClient.fair_lock`."""

    def __init__(self, client: LockClient, name: str, **options: Unpack[LockOptions]) -> None:
        super().__init__(client, name, **options)
        self._fair_setup()

    def __repr__(self) -> str:
        return f"<FairLock {self.name!r}>"

    def __enter__(self) -> FairLock:
        super().__enter__()
        return self

    def _acquire_waiting(self, plan: AcquirePlan, lease_seconds: float | None) -> bool:
        owner = thread_owner()
        queue_id = self._queue_id(plan, self.client.listener.new_waiter_id)
        shell = _FairWaiting(self, owner, lease_seconds, plan, queue_id)
        try:
            granted = drive(plan, shell)
        finally:
            shell.close(registered=plan.registered)
        if not granted:
            self._gave_up(owner, plan)
        return granted

    def _queued_attempt(
        self, owner: str, lease: float | None, queue_id: str, sleep: float, started: float
    ) -> float | None:
        """One fair acquire call: None when granted, else the seconds to wait at most."""
        return self._attempt(owner, lease, queue_id, sleep, requested_at=started)

    def _acquire_sender(self) -> Callable[..., Any]:
        send: Callable[..., Any] = self.client.fair_scripts.acquire
        return send

    def _release_sender(self) -> Callable[..., Any]:
        send: Callable[..., Any] = self.client.fair_scripts.release
        return send

    def _abandon(self, waiter_id: str) -> None:
        """Leave the queue without the lock, waking the next head if the lock is free."""
        call = self._abandon_call(waiter_id)
        try:
            self.client.fair_scripts.abandon(keys=call.keys, args=call.args)
        except Exception:
            logger.debug("could not leave the queue of fair lock %r", self.name, exc_info=True)


class _FairWaiting:
    """The sync shell of an :class:`AcquirePlan` for a fair lock: queued attempts.

    As the plain lock's shell, except that every attempt of a blocking call
    carries the caller's queue id, the first one too, and announces its own
    sleep (:func:`sleep_cap`, not the plan's: the fair script bounds the wait it
    replies by it, so the entry outlives the sleep that follows).
    """

    def __init__(
        self, lock: FairLock, owner: str, lease: float | None, plan: AcquirePlan, queue_id: str
    ) -> None:
        self.lock, self.owner, self.lease, self.plan = lock, owner, lease, plan
        self.queue_id = queue_id
        self.subscription: Subscription | None = None
        #: An attempt that may have queued the caller was sent, and no grant
        #: came back: the queue must be left on the way out.
        self.queued = False
        self._stack = ExitStack()

    def attempt(self, waiter: bool, sleep: float) -> float | None:
        # Before sending: a call whose reply is lost may have queued the caller.
        self.queued = self.queued or bool(self.queue_id)
        wait = self.lock._queued_attempt(
            self.owner, self.lease, self.queue_id, sleep_cap(self.plan), self.plan.started
        )
        if wait is None:
            self.queued = False  # the grant took the caller out of the queue
        return wait

    def listen(self) -> None:
        listener = self.lock.client.listener
        self.subscription = self._stack.enter_context(
            listener.listen(self.lock.keys.channel, self.queue_id)
        )

    def close(self, *, registered: bool) -> None:
        with self._stack:
            if self.queued or (registered and self.queue_id):
                self.lock._abandon(self.queue_id)
