"""FairLock: an RLock granted in arrival order (Redisson's RFairLock).

Everything of :class:`~django_rlock.core._sync.locks.RLock` holds (reentrant, owner
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
key layout are in :mod:`django_rlock.core._protocol.fairlock`.

Handoff: the release that frees the lock grants it to the head inside the
script and says so in its message, so a head waiting with the watchdog holds
the lock when the message arrives, with no acquire call. Its deadline counts
from its own last attempt's send time (the grant came after that attempt, and
lives the watchdog timeout): never from the message's arrival. A head with a
fixed lease, or whose last attempt is so old that the watchdog might not renew
the grant before that deadline, confirms it with one acquire call instead.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Unpack

from django_rlock.core._protocol import clock
from django_rlock.core._protocol.deadlocks import Detector
from django_rlock.core._protocol.fairlock import FairBase, FairScripts, sleep_cap
from django_rlock.core._protocol.lock import KindScripts, LockOptions, LockScripts
from django_rlock.core._protocol.plan import AcquirePlan
from django_rlock.core._sync.locks import HandOverSubscription, RLock, WaitingShellBase
from django_rlock.core._sync.shell import Client, SyncShell
from django_rlock.core._sync.waiting import Waiting


class FairLock(FairBase, RLock):
    """A reentrant lock granted in arrival order; get one from :meth:`LockClient.fair_lock`."""

    def __init__(self, client: Client, name: str, **options: Unpack[LockOptions]) -> None:
        super().__init__(client, name, **options)
        self._fair_setup()

    def __repr__(self) -> str:
        return f"<FairLock {self.name!r}>"

    def __enter__(self) -> FairLock:
        super().__enter__()
        return self

    def _waiting_shell(self, owner: str, lease: float | None, plan: AcquirePlan) -> SyncShell:
        # The caller queues: every attempt of a blocking call carries its queue id.
        queue_id = self._queue_id(plan, self.client.listener.new_waiter_id)
        return _FairWaiting(self, owner, lease, plan, queue_id)

    def _queued_attempt(
        self,
        owner: str,
        lease: float | None,
        queue_id: str,
        sleep: float,
        started: float,
        *,
        until: float = 0.0,
    ) -> float | None:
        """One fair acquire call: None when granted, else the seconds to wait at most."""
        return self._attempt(owner, lease, queue_id, sleep, requested_at=started, until=until)

    def _kind_scripts(self) -> KindScripts:
        return self._fair_row(self.client.scripts[FairScripts], self.client.scripts[LockScripts])

    def _handed(self, waiting: _FairWaiting, subscription: Waiting) -> bool:
        """Take the grant a handoff message brought, if any (see :meth:`_take_handoff`)."""
        if not self._take_handoff(waiting, subscription):
            return False
        self._clear_lost()
        return True

    def _leave_queue(self, queue_id: str, *, abandon: bool) -> None:
        """An acquire call's way out: forget its last request, leave the queue if it may be in."""
        self._end_waiting(queue_id)
        if abandon:
            self._abandon(queue_id)


class _FairWaiting(WaitingShellBase):
    """The sync shell of an :class:`AcquirePlan` for a fair lock: queued attempts.

    As the plain lock's shell, except that every attempt of a blocking call
    carries the caller's queue id, the first one too, and announces its own
    sleep (:func:`sleep_cap`, not the plan's: the fair script bounds the wait it
    replies by it, so the entry outlives the sleep that follows).
    """

    lock: FairLock

    def __init__(
        self, lock: FairLock, owner: str, lease: float | None, plan: AcquirePlan, queue_id: str
    ) -> None:
        self.lock, self.owner, self.lease, self.plan = lock, owner, lease, plan
        self.started = plan.started
        self.queue_id = queue_id
        self.subscription: HandOverSubscription | None = None
        #: An attempt that may have queued the caller was sent, and no grant
        #: came back: the queue must be left on the way out.
        self.queued = False
        #: When the last attempt was sent (at the latest): a handed grant's
        #: deadline counts from it.
        self.sent_at = plan.started
        self._stack = ExitStack()
        # Made by the first deadlock check (most calls never wait that long).
        self.detector: Detector | None = None

    def attempt(self, waiter: bool, sleep: float) -> float | None:
        # Before sending: a call whose reply is lost may have queued the caller.
        self.queued = self.queued or bool(self.queue_id)
        self.sent_at = clock.monotonic()
        plan = self.plan
        wait = self.lock._queued_attempt(
            self.owner,
            self.lease,
            self.queue_id,
            sleep_cap(plan),
            plan.started,
            until=plan.deadline if plan.blocking else 0.0,
        )
        if wait is None:
            self.queued = False  # the grant took the caller out of the queue
        return wait

    def listen(self) -> None:
        listener = self.lock.client.listener
        subscription = self._stack.enter_context(
            listener.listen(self.lock.keys.channel, self.queue_id)
        )
        self.subscription = HandOverSubscription(self, subscription)

    def handed(self, subscription: Waiting) -> bool:
        return self.lock._handed(self, subscription)

    def close(self, *, registered: bool) -> None:
        with self._stack:
            self.forget_edge()
            abandon = self.queued or (registered and bool(self.queue_id))
            self.lock._leave_queue(self.queue_id, abandon=abandon)
