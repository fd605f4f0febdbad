"""The watchdog: one daemon thread per process keeps every watchdog hold alive.

A hold taken with ``lease=None`` has its key set to expire after the client's
``watchdog_timeout``; the watchdog renews it every ``watchdog_timeout / 3``
until it is released. A renewal extends a key to *at least* the timeout and
never shortens it, so a watchdog hold re-entered with a longer lease (or the
reverse) lives to the later of the two. All holds of one client are renewed
together on one schedule, up to :data:`BATCH_SIZE` keys per EVAL, so 2,000
held locks cost 20 round trips per interval, not 2,000 timers. One EVAL may
only touch one slot of a Redis Cluster, so there the batches are formed per
slot, and a round sends each node's batches as one pipeline, to every node at
once (:mod:`django_rlock.core._sync.noderounds`): one round trip per node, however
many slots are held, and a node that hangs delays no other node's renewals.
Each batch keeps its own outcome, as if sent alone. After a round in which
some failed, the slot map is read anew if they say it moved (MOVED, a node
unreachable or silent: a stopped master replaced by its replica). A batch
refused because its slot moved is sent again within the round, while its
holds' deadlines allow another call (below): after a MOVED reply to the slot's
new node, on the map read anew, and after an ASK alone through the cluster
client, which follows it.

When a renewal finds a key gone or owned by someone else, the hold is lost and
the client is told at once. A hold whose owner (thread or task) has ended is
never renewed (:mod:`django_rlock.core._process.leaks` reports it and gives it back),
and a hold older than its ``max_hold`` is no longer renewed and is declared
lost, at the first tick past that bound. When Redis cannot be reached, the renewal is tried
again on the next tick; the hold counts as lost once its local deadline (the
send time of its last successful renewal or acquire plus the PTTL the server
reported, see :mod:`django_rlock.core._protocol.holds`) has passed, because from then on
another owner may hold the lock. Renewal connections have no hidden retries and a socket
timeout of a fraction of the interval, so no renewal blocks past a deadline (a
cluster's round waits no longer for its nodes: one with no reply by then fails its batches).
No renewal is started that could end after its hold's deadline (a call may
take up to half an interval): while renewals fail, the last attempt is made
early enough to end half an interval before the deadline, and when it fails
too the hold is declared lost then. The holder thus hears of the loss about
half an interval (timeout / 6) before its key can expire on the server, with
that much room for the callbacks' thread and any scheduling delay.

Each renewal's outcome, per hold, goes to the callbacks given to
:func:`on_renewal` (the Django face's metrics count them): ``"ok"`` (the key
was extended), ``"failed"`` (the call failed; tried again next tick) or
``"lost"`` (the key was gone or another owner's, or the deadline came before a
renewal could be sent). With no callback the watchdog does no extra work.

The thread never dies on an error: it logs it on ``django_rlock.watchdog`` and
carries on. A forked child starts with no watchdog; its first hold starts one.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from redis.exceptions import AskError, MovedError

from django_rlock.core._process import forking
from django_rlock.core._process.identity import owner_alive
from django_rlock.core._protocol import clock
from django_rlock.core._protocol.holds import Hold
from django_rlock.core.defaults import renewal_interval, renewal_socket_timeout

logger = logging.getLogger("django_rlock.watchdog")


#: Locks renewed by one EVAL. Large enough to amortise round trips, small
#: enough that one script never stalls the server for long.
BATCH_SIZE = 100


#: What one renewal of one hold came to (see the module's docstring).
RenewalOutcome = Literal["ok", "failed", "lost"]


#: Called with the hold and the outcome of each renewal (see :func:`on_renewal`).
RenewalCallback = Callable[[Hold, RenewalOutcome], object]


# Process-wide, kept across fork: a forked child's watchdog reports to the same callbacks.
_renewal_callbacks: list[RenewalCallback] = []


def on_renewal(callback: RenewalCallback) -> None:
    """Call ``callback(hold, outcome)`` for each hold's renewal from now on, on the watchdog thread.

    It must be quick and must not block: the watchdog renews every lock of the
    process. One that raises is logged and the others still run.
    """
    _renewal_callbacks.append(callback)


def remove_on_renewal(callback: RenewalCallback) -> None:
    """Stop calling ``callback`` (given to :func:`on_renewal`)."""
    _renewal_callbacks[:] = [known for known in _renewal_callbacks if known is not callback]


def _report(hold: Hold, outcome: RenewalOutcome) -> None:
    for callback in list(_renewal_callbacks):
        try:
            callback(hold, outcome)
        except Exception:
            logger.exception("renewal callback %r failed", callback)


class Renewer(Protocol):
    """What the watchdog needs from a lock client."""

    watchdog_timeout: float
    #: The hash slot of a key on a cluster (batches never mix slots), else None.
    slot_of: Callable[[str], int] | None

    def watched_holds(self) -> list[Hold]:
        """The holds to renew now: watchdog holds not released and not lost."""
        ...

    def renew_batch(self, holds: Sequence[Hold]) -> list[int]:
        """Extend each hold's key; per hold its PTTL in ms after the call, 0 when no longer held."""
        ...

    def renew_batches(self, batches: Sequence[Sequence[Hold]]) -> list[list[int] | Exception]:
        """On a cluster: renew one-slot batches, a round trip per node; per batch reply or error."""
        ...

    def refresh_slot_map(self) -> None:
        """After :meth:`renew_batches` failed some: read the slot map anew if they say it moved.

        Never raises: a failed read leaves the map as it was.
        """
        ...

    def declare_lost(self, hold: Hold, reason: str) -> None:
        """Record that ``hold`` is lost and tell its listeners."""
        ...

    def owner_gone(self, hold: Hold) -> None:
        """``hold``'s owner ended while holding it: report it and give it back (not renewed)."""
        ...

    def renewed(self, hold: Hold, sent_at: float, pttl_ms: int) -> None:
        """Record that a renewal sent at ``sent_at`` left ``hold``'s key ``pttl_ms`` to live."""
        ...


@dataclass(eq=False)
class _Schedule:
    """When one client's holds are renewed next. Holds the client weakly."""

    renewer: weakref.ref[Renewer]
    interval: float
    #: The longest a renewal call may take (its socket timeout).
    call_margin: float
    next_tick: float
    failing: bool = False


class Watchdog:
    """Renews the watchdog holds of every client in this process from one thread.

    Clients register once (:meth:`watch`); at each tick the watchdog asks the
    client for its current holds, so taking and releasing a lock costs the
    watchdog nothing.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._schedules: dict[int, _Schedule] = {}
        self._thread: threading.Thread | None = None
        #: Renewal EVALs sent since start (a cluster's pipelines counted by their
        #: EVALs, not their round trips); read by tests and benchmarks.
        self.renewal_calls = 0
        #: Renewal EVALs that failed (an error or no reply in time).
        self.renewal_failures = 0

    @property
    def thread(self) -> threading.Thread | None:
        """The renewal thread, once a client has started it."""
        return self._thread

    def watch(self, renewer: Renewer) -> None:
        """Renew ``renewer``'s holds every ``watchdog_timeout / 3`` until :meth:`forget`."""
        with self._cond:
            if id(renewer) in self._schedules:
                return
            timeout = renewer.watchdog_timeout
            interval = renewal_interval(timeout)
            self._schedules[id(renewer)] = _Schedule(
                weakref.ref(renewer),
                interval,
                call_margin=renewal_socket_timeout(timeout),
                next_tick=clock.monotonic() + interval,
            )
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="rlock-watchdog", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def forget(self, renewer: Renewer) -> None:
        """Stop renewing ``renewer``'s holds (its client is closing)."""
        with self._cond:
            self._schedules.pop(id(renewer), None)

    def _run(self) -> None:
        while True:
            for schedule, renewer in self._wait_for_due():
                try:
                    self._renew(schedule, renewer)
                except Exception:
                    # A bug here must not end renewals for every other lock.
                    logger.exception("watchdog: unexpected error while renewing locks")

    def _wait_for_due(self) -> list[tuple[_Schedule, Renewer]]:
        with self._cond:
            while True:
                now = clock.monotonic()
                due: list[tuple[_Schedule, Renewer]] = []
                next_wake: float | None = None
                for key, schedule in list(self._schedules.items()):
                    renewer = schedule.renewer()
                    if renewer is None:  # the client was garbage-collected
                        del self._schedules[key]
                        continue
                    if schedule.next_tick <= now:
                        due.append((schedule, renewer))
                        schedule.next_tick = now + schedule.interval
                    if next_wake is None or schedule.next_tick < next_wake:
                        next_wake = schedule.next_tick
                if due:
                    return due
                self._cond.wait(None if next_wake is None else next_wake - now)

    def _due(self, schedule: _Schedule, renewer: Renewer) -> list[Hold]:
        """The holds to renew this tick; the others are settled here, without a call."""
        now = clock.monotonic()
        due = []
        for hold in renewer.watched_holds():
            if not owner_alive(hold.owner):
                renewer.owner_gone(hold)
                continue
            if hold.max_hold is not None and now - hold.acquired_at >= hold.max_hold:
                reason = f"it was held past its max_hold of {hold.max_hold:g}s"
            elif now + schedule.call_margin >= hold.deadline:
                # A call now could end past the deadline (the thread was late):
                # say so now, not after a call.
                reason = "its deadline came before it could be renewed"
            else:
                due.append(hold)
                continue
            renewer.declare_lost(hold, reason)
            if _renewal_callbacks:
                _report(hold, "lost")
        return due

    def _renew(self, schedule: _Schedule, renewer: Renewer) -> None:
        due = self._due(schedule, renewer)
        if renewer.slot_of is None:
            for batch in _batches(due, None):
                self._send(schedule, renewer, batch)
        else:
            self._renew_by_node(schedule, renewer, _batches(due, renewer.slot_of))

    def _send(self, schedule: _Schedule, renewer: Renewer, batch: list[Hold]) -> None:
        """One batch, one EVAL, one round trip."""
        sent_at = clock.monotonic()
        self.renewal_calls += 1
        try:
            renewed = renewer.renew_batch(batch)
        except Exception as error:  # noqa: BLE001 -- any failure is retried on the next tick
            self._renewal_failed(schedule, renewer, batch, error)
            return
        self._settle(schedule, renewer, batch, sent_at, renewed)

    def _renew_by_node(
        self, schedule: _Schedule, renewer: Renewer, batches: list[list[Hold]]
    ) -> None:
        """A cluster's round: one pipeline per node; a batch refused for a moved slot goes again.

        After a failure the map is read anew (:meth:`Renewer.refresh_slot_map`);
        then a MOVED batch is sent again at once to the slot's new node, an ASK
        one alone through the cluster client (which follows it); only holds
        whose deadline leaves room for one more call go again.
        """
        failed = self._send_by_node(schedule, renewer, batches)
        moved: list[tuple[list[Hold], Exception]] = []
        for batch, error in failed:
            if isinstance(error, AskError):  # MovedError is one too
                moved.append((batch, error))
            else:
                self._renewal_failed(schedule, renewer, batch, error)
        if failed:
            renewer.refresh_slot_map()  # after the failures are settled: it takes a call or more
        redirected: list[list[Hold]] = []
        asked: list[tuple[list[Hold], Exception]] = []
        for batch, error in moved:
            ready = self._may_send(schedule, renewer, batch, error)
            if ready and isinstance(error, MovedError):
                redirected.append(ready)
            elif ready:
                asked.append((ready, error))
        for batch, error in self._send_by_node(schedule, renewer, redirected):
            self._renewal_failed(schedule, renewer, batch, error)
        for batch, error in asked:  # one slot half-moved at a time, as a rule: few
            ready = self._may_send(schedule, renewer, batch, error)
            if ready:
                self._send(schedule, renewer, ready)

    def _send_by_node(
        self, schedule: _Schedule, renewer: Renewer, batches: list[list[Hold]]
    ) -> list[tuple[list[Hold], Exception]]:
        """Send ``batches`` with one pipeline per node; settle the renewed, return the failed."""
        if not batches:
            return []
        sent_at = clock.monotonic()
        self.renewal_calls += len(batches)
        try:
            replies = renewer.renew_batches(batches)
        except Exception as error:  # noqa: BLE001 -- any failure is retried on the next tick
            return [(batch, error) for batch in batches]
        failed = []
        for batch, reply in zip(batches, replies, strict=True):
            if isinstance(reply, Exception):
                failed.append((batch, reply))
            else:
                self._settle(schedule, renewer, batch, sent_at, reply)
        return failed

    def _may_send(
        self, schedule: _Schedule, renewer: Renewer, batch: list[Hold], error: Exception
    ) -> list[Hold]:
        """The holds of ``batch`` another call may be started for now; the others failed."""
        call_end = clock.monotonic() + schedule.call_margin  # at the latest
        ready = [hold for hold in batch if call_end < hold.deadline]
        late = [hold for hold in batch if call_end >= hold.deadline]
        if late:
            self._renewal_failed(schedule, renewer, late, error)  # declared lost there
        return ready

    def _settle(
        self,
        schedule: _Schedule,
        renewer: Renewer,
        batch: list[Hold],
        sent_at: float,
        renewed: list[int],
    ) -> None:
        """Take in a batch's reply: each hold renewed, or lost."""
        if schedule.failing:
            schedule.failing = False
            logger.info("watchdog: renewals succeed again")
        for hold, pttl_ms in zip(batch, renewed, strict=True):
            if pttl_ms > 0:
                renewer.renewed(hold, sent_at, pttl_ms)
            else:
                renewer.declare_lost(hold, "its key expired or another owner took it")
            if _renewal_callbacks:
                _report(hold, "ok" if pttl_ms > 0 else "lost")

    def _renewal_failed(
        self, schedule: _Schedule, renewer: Renewer, batch: list[Hold], error: Exception
    ) -> None:
        self.renewal_failures += 1
        if _renewal_callbacks:
            for hold in batch:
                _report(hold, "failed")
        if not schedule.failing:
            schedule.failing = True
            logger.warning("watchdog: renewal failed, retrying next tick: %s", error)
        margin = schedule.call_margin
        now = clock.monotonic()
        alive = []
        for hold in batch:
            if now + margin >= hold.deadline:
                renewer.declare_lost(hold, f"renewals failed until its deadline ({error})")
                if _renewal_callbacks:
                    _report(hold, "lost")  # as on every other path to a loss
            else:
                alive.append(hold)
        if alive:
            # A last attempt that, even taking a full call, ends a margin
            # before the first deadline: if it fails, the loss is told then.
            earliest = min(hold.deadline for hold in alive) - 2 * margin
            with self._cond:
                schedule.next_tick = min(schedule.next_tick, earliest)


def _batches(holds: list[Hold], slot_of: Callable[[str], int] | None) -> list[list[Hold]]:
    """``holds`` cut into EVAL-sized batches, each within one slot when ``slot_of`` is given."""
    groups: list[list[Hold]] = [holds]
    if slot_of is not None:
        by_slot: dict[int, list[Hold]] = {}
        for hold in holds:
            by_slot.setdefault(slot_of(hold.key), []).append(hold)
        groups = list(by_slot.values())
    return [
        group[start : start + BATCH_SIZE]
        for group in groups
        for start in range(0, len(group), BATCH_SIZE)
    ]


_instance: Watchdog | None = None


_instance_lock = threading.Lock()


def get_watchdog() -> Watchdog:
    """The process's watchdog (a new one in a forked child)."""
    global _instance  # noqa: PLW0603 -- one watchdog per process is the design
    with _instance_lock:
        if _instance is None:
            _instance = Watchdog()
        return _instance


@forking.after_fork_in_child
def _reset_after_fork() -> None:
    # The parent's thread does not exist in the child, and the child owns
    # none of the parent's holds: start from nothing.
    global _instance, _instance_lock  # noqa: PLW0603
    _instance = None
    _instance_lock = threading.Lock()
