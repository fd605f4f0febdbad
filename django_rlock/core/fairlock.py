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
from typing import TYPE_CHECKING, Protocol, Unpack

from django_rlock.core import clock
from django_rlock.core.calls import ScriptCall
from django_rlock.core.defaults import renewal_interval, renewal_socket_timeout
from django_rlock.core.fairlock_scripts import (
    FairKeys,
    fair_abandon_call,
    fair_acquire_call,
    fair_keys,
    fair_release_call,
)
from django_rlock.core.lock import KindScripts, LockBase, LockOptions, RLock, WaitingShell
from django_rlock.core.names import milliseconds
from django_rlock.core.plan import HANDED, AcquirePlan

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from django_rlock.core.channels import WakeCount
    from django_rlock.core.client import LockClient
    from django_rlock.core.waiting import Subscription

__all__ = ["FairBase", "FairLock", "handoff_min_life", "sleep_cap"]


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


def handoff_min_life(watchdog_timeout: float) -> float:
    """The least life left, in seconds, for a handed grant to be taken without a call.

    The watchdog renews on its own ticks (every third of the timeout) and
    declares a hold lost when a renewal could end within a margin (a sixth)
    of its deadline; a handed grant whose deadline is nearer than a tick and
    two margins could be declared lost while Redis keeps it. Its waiter
    confirms it with an acquire call instead, which renews it.
    """
    return renewal_interval(watchdog_timeout) + 2 * renewal_socket_timeout(watchdog_timeout)


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
        #: Queue id -> request id of that waiter's last attempt, which a
        #: handoff message names (one entry per waiting acquire call).
        self._last_requests: dict[str, str] = {}

    def _acquire_call(
        self, owner: str, lease: float | None, waiter_id: str, sleep: float
    ) -> ScriptCall:
        """The plain acquire call on the fair keys, plus the queue (``waiter_id``: queue id)."""
        call = fair_acquire_call(
            super()._acquire_call(owner, lease, waiter_id, sleep),
            self.fair_keys,
            self._engine.watchdog_timeout,
        )
        if waiter_id:
            self._last_requests[waiter_id] = call.rid
        return call

    def _release_call(self, owner: str) -> ScriptCall:
        """The plain release call on the fair keys, plus what a handoff needs."""
        return fair_release_call(super()._release_call(owner), self.fair_keys)

    def _abandon_call(self, queue_id: str) -> ScriptCall:
        return fair_abandon_call(self.fair_keys, queue_id, self._engine.publish_command)

    @staticmethod
    def _fair_row(fair: Any, plain: Any) -> KindScripts:
        """The fair scripts' row (see :class:`KindScripts`) from the fair and plain script sets.

        FAIR_ABANDON leaves the queue, waking the next head if the lock is
        free. Force-release is the plain lock's: deleting the hash frees the
        lock, and its message wakes the queue's head, which keeps its turn.
        """
        return KindScripts(fair.acquire, fair.release, fair.abandon, plain.force_release)

    def _take_handoff(
        self,
        waiting: _FairShell,
        subscription: WakeCount,
    ) -> bool:
        """Record the grant a handoff message brought ``waiting``'s caller; False: none taken.

        Taken only when the message names the caller's last attempt (so the
        grant came after that attempt was sent, and its send time bounds the
        deadline from below), the caller waits with the watchdog, and that
        deadline leaves the watchdog time to renew. Otherwise the caller's
        next attempt confirms the grant (FAIR_ACQUIRE), or finds it gone.
        """
        grant, subscription.handoff = subscription.handoff, b""
        if not grant or waiting.lease is not None:
            return False
        token, _, rid = grant.partition(b" ")
        last = self._last_requests.get(waiting.queue_id)
        # Anything else on the channel (a stale or foreign message) is only a wake-up.
        if last is None or rid != last.encode() or not token.isdigit():
            return False
        watchdog = self._engine.watchdog_timeout
        if waiting.sent_at + watchdog - clock.monotonic() <= handoff_min_life(watchdog):
            return False
        self._registry.grant(
            self,
            waiting.owner,
            token=int(token),
            holds=1,
            lease=None,
            sent_at=waiting.sent_at,
            pttl_ms=milliseconds(watchdog),
            requested_at=waiting.plan.started,
        )
        waiting.queued = False  # the handoff took the caller out of the queue
        return True

    def _end_waiting(self, queue_id: str) -> None:
        self._last_requests.pop(queue_id, None)

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

    def _waiting_shell(self, owner: str, lease: float | None, plan: AcquirePlan) -> WaitingShell:
        # The caller queues: every attempt of a blocking call carries its queue id.
        queue_id = self._queue_id(plan, self.client.listener.new_waiter_id)
        return _FairWaiting(self, owner, lease, plan, queue_id)

    def _queued_attempt(
        self, owner: str, lease: float | None, queue_id: str, sleep: float, started: float
    ) -> float | None:
        """One fair acquire call: None when granted, else the seconds to wait at most."""
        return self._attempt(owner, lease, queue_id, sleep, requested_at=started)

    def _kind_scripts(self) -> KindScripts:
        return self._fair_row(self.client.fair_scripts, self.client.scripts)

    def _handed(self, waiting: _FairWaiting, subscription: Subscription) -> bool:
        """Take the grant a handoff message brought, if any (see :meth:`_take_handoff`)."""
        if not self._take_handoff(waiting, subscription):
            return False
        self._local.lost = False
        return True

    def _leave_queue(self, queue_id: str, *, abandon: bool) -> None:
        """An acquire call's way out: forget its last request, leave the queue if it may be in."""
        self._end_waiting(queue_id)
        if abandon:
            self._abandon(queue_id)


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
        self.subscription: _HandoffSubscription | None = None
        #: An attempt that may have queued the caller was sent, and no grant
        #: came back: the queue must be left on the way out.
        self.queued = False
        #: When the last attempt was sent (at the latest): a handed grant's
        #: deadline counts from it.
        self.sent_at = plan.started
        self._stack = ExitStack()

    def attempt(self, waiter: bool, sleep: float) -> float | None:
        # Before sending: a call whose reply is lost may have queued the caller.
        self.queued = self.queued or bool(self.queue_id)
        self.sent_at = clock.monotonic()
        wait = self.lock._queued_attempt(
            self.owner, self.lease, self.queue_id, sleep_cap(self.plan), self.plan.started
        )
        if wait is None:
            self.queued = False  # the grant took the caller out of the queue
        return wait

    def listen(self) -> None:
        listener = self.lock.client.listener
        subscription = self._stack.enter_context(
            listener.listen(self.lock.keys.channel, self.queue_id)
        )
        self.subscription = _HandoffSubscription(self, subscription)

    def close(self, *, registered: bool) -> None:
        with self._stack:
            abandon = self.queued or (registered and bool(self.queue_id))
            self.lock._leave_queue(self.queue_id, abandon=abandon)


class _HandoffSubscription:
    """A fair waiter's subscription: a wake-up that hands it the lock ends its plan."""

    def __init__(self, shell: _FairWaiting, subscription: Subscription) -> None:
        self.shell, self.inner = shell, subscription
        self.waiter_id = subscription.waiter_id

    def wait_subscribed(self, timeout: float) -> bool:
        return self.inner.wait_subscribed(timeout)

    def mark(self) -> int:
        return self.inner.mark()

    def wait(self, since: int, timeout: float) -> object:
        """As :meth:`Subscription.wait`, or :data:`HANDED` when the lock was handed to us."""
        woken = self.inner.wait(since, timeout)
        shell = self.shell
        return HANDED if shell.lock._handed(shell, self.inner) else woken


class _FairShell(Protocol):
    """What :meth:`FairBase._take_handoff` reads of a waiting shell (sync or asyncio)."""

    owner: str
    lease: float | None
    plan: AcquirePlan
    queue_id: str
    queued: bool
    sent_at: float
