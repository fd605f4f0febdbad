"""ElectedScheduler: run ``celery beat`` on every host; one sends the schedule, the others stand by.

::

    celery -A proj beat -S celery_rlock.beat:ElectedScheduler
    # or: app.conf.beat_scheduler = "celery_rlock.beat:ElectedScheduler"

    app.conf.rlock_beat_scheduler = "django_celery_beat.schedulers:DatabaseScheduler"
    app.conf.rlock_beat_lock = "celery-beat"            # the default

Every beat stands for election on the lock ``rlock_beat_lock`` (a leader
election, :mod:`django_rlock.core._sync.leader`), on the lock server of the Celery
tasks (:mod:`celery_rlock._conf`: ``RLOCKS["default"]`` in a Django project,
``rlock_url`` or a Redis ``broker_url`` otherwise). The lock is held by beat's
main thread, which runs the whole term.

* **Standing by**, a beat waits for the lock: woken by the leader's release, or,
  if the leader died, when its key expires (within one watchdog timeout). No
  polling: each wait lasts up to ``max_interval`` (``beat_max_loop_interval``),
  then beat's own loop looks at its shutdown flag and the wait goes on.
* **Elected**, it builds the scheduler named by ``rlock_beat_scheduler`` afresh,
  so its state is read from where that scheduler keeps it (the schedule file,
  the database); each entry whose last run any beat recorded in Redis (see
  below) continues from that run, and a run that fell due meanwhile is sent at
  once (once, as beat catches up). Then it ticks it.
* **Before each send**, the run's slot, its entry's name and scheduled time, is
  claimed in Redis by one script that refuses unless this beat still holds the
  election's lock and no beat sent that slot (or a later one) of the entry. A
  leader that lost its lock and has not heard of it yet sends nothing, and no
  slot is sent twice; a slot whose claim cannot be made (the lock server is
  unreachable) is not sent.
* **Losing the term** (the lock expired, was taken, or broken by an operator),
  the beat stops sending, closes the wrapped scheduler (saving its state), and
  stands by again. It never exits because of it.
* **Stopping** (SIGTERM, Ctrl-C), the beat saves the schedule and releases the
  lock, so a standby takes over at once. A stop that comes between a slot's
  claim and its send waits for the send: beat's handler would end the beat
  there, leaving a slot that no beat sends.

The record of an entry's last slot, ``<lock key>:beat:<entry name>``, lives one
interval of the entry plus two watchdog timeouts after its send: long enough
for a standby that takes over before the entry's next run to catch up, no
longer. Each message sent carries the headers ``rlock_beat_slot`` (the scheduled
time, ISO 8601 in UTC) and ``rlock_beat_token`` (the fencing token of the
leader's term): a task reads them as ``self.request.rlock_beat_slot``, for an
idempotency key or a fenced write. docs/beat.md has the failover timeline.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, cast

from celery.beat import Scheduler
from celery.schedules import crontab
from celery.schedules import schedule as every
from celery.utils.imports import qualname, symbol_by_name
from celery.utils.time import maybe_make_aware, remaining
from redis.exceptions import RedisError

from celery_rlock._conf import BeatSettings, ConfigurationError, get_lock
from django_rlock.core import Leadership, Term
from django_rlock.core._faces import holder_line, milliseconds, reported_unavailable, thread_owner
from django_rlock.core.defaults import DEFAULT_LOCK_ALIAS, renewal_interval
from django_rlock.core.exceptions import LockTimeout, LockUnavailableError

if TYPE_CHECKING:
    from types import FrameType

    from celery import Celery
    from celery.beat import ScheduleEntry
    from redis.commands.core import Script

    from django_rlock.core import RLock

__all__ = [
    "CLAIM_SLOT",
    "SLOT_HEADER",
    "TOKEN_HEADER",
    "ElectedScheduler",
    "scheduled_at",
]

# Under beat's own logger, not "celery_rlock": that one is Celery's task logger,
# whose format prefixes every line with a task name and id ("???" in beat).
logger = logging.getLogger("celery.beat.rlock")

#: The message headers of a scheduled send: the slot's time and the term's token.
SLOT_HEADER: Final = "rlock_beat_slot"
TOKEN_HEADER: Final = "rlock_beat_token"

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)

# Claim one scheduled run of a beat entry for the leading beat.
# KEYS[1]  the election lock's hash (owner id -> hold count)
# KEYS[2]  the entry's record: the last slot sent, in ms since the epoch
# ARGV[1]  the caller's owner id
# ARGV[2]  the slot to send, in ms since the epoch
# ARGV[3]  how long the record lives, in ms
# Returns  1: claimed, send it; 0: this slot or a later one was sent already;
#          -1: the caller does not hold the lock (its term is over)
CLAIM_SLOT: Final = """
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
    return -1
end
local last = tonumber(redis.call('get', KEYS[2]))
if last and last >= tonumber(ARGV[2]) then
    return 0
end
redis.call('set', KEYS[2], ARGV[2], 'px', ARGV[3])
return 1
"""


def scheduled_at(entry: ScheduleEntry) -> datetime:
    """When the run of ``entry`` due now (or next) was scheduled for, timezone-aware.

    Computed from the entry's last run as Celery computes due-ness, with one
    ``now`` for both sides, so two beats with the same last run get the same
    instant: exactly for interval and crontab schedules; for other kinds
    (solar, clocked...) from the time they say is left, to the whole second.
    Milliseconds are the unit (what Redis records), so sub-millisecond parts
    are dropped.
    """
    plan = entry.schedule
    last = entry.last_run_at
    if isinstance(plan, crontab):
        # Celery before 5.7 looks for the next run in the last run's hour only when
        # ``now`` falls on the last run's day (else it skips to a later hour): with
        # ``now`` read as the last run, the slot is the run that follows it, whenever
        # it is computed (Celery 5.7 reads ``now`` here for the return value only).
        start, ends_in, now = _clock_at(plan, last).remaining_delta(last)
        moment: datetime = now + remaining(start, ends_in, now)
    elif isinstance(plan, every):
        now = plan.maybe_make_aware(plan.now())
        moment = now + remaining(plan.maybe_make_aware(last), plan.run_every, now, plan.relative)
    else:
        now = plan.maybe_make_aware(plan.now())
        moment = now + plan.remaining_estimate(last) + timedelta(milliseconds=500)
        moment = moment.replace(microsecond=0)
    aware: datetime = maybe_make_aware(moment)
    return aware.replace(microsecond=aware.microsecond // 1000 * 1000)


def _clock_at(plan: crontab, moment: datetime) -> crontab:
    """A copy of ``plan`` whose clock reads ``moment``.

    Copied attribute by attribute: a pickling copy (``copy.copy``) would lose the
    app that beat gave the schedule, and with it the app's timezone.
    """
    pinned: crontab = object.__new__(type(plan))
    vars(pinned).update(vars(plan), nowfun=lambda: moment)
    return pinned


def _epoch_ms(moment: datetime) -> int:
    return (moment - _EPOCH) // timedelta(milliseconds=1)


class ElectedScheduler(Scheduler):  # type: ignore[misc]  # Celery's Scheduler is untyped (Any)
    """A beat scheduler that sends only while this beat leads; see the module.

    Built by ``celery beat`` with the keywords it gives any scheduler
    (``schedule_filename``, ``max_interval``...); they are passed on to the
    wrapped scheduler each time this beat is elected.
    """

    def __init__(self, app: Celery, *args: Any, lazy: bool = False, **kwargs: Any) -> None:
        settings = BeatSettings.from_app(app)
        #: The scheduler class that keeps the schedule (``rlock_beat_scheduler``).
        self.wrapped = _wrapped_class(settings.scheduler)
        #: The election lock's name (``rlock_beat_lock``).
        self.lock_name = settings.lock
        self._wrapped_args, self._wrapped_kwargs = args, kwargs
        # Nothing of the base scheduler's own schedule is set up: the wrapped one keeps it.
        super().__init__(app, *args, lazy=True, **kwargs)
        self._leadership = Leadership(
            self.lock_name, self._election_lock, timeout=self.max_interval
        )
        self._office = ExitStack()  # the term, while this beat leads
        self._lock: RLock | None = None
        self._claim_script: Script | None = None
        #: The current term while this beat leads, else None.
        self.term: Term | None = None
        #: The wrapped scheduler while this beat leads, else None.
        self.leading: Scheduler | None = None
        self._ticking = False
        self._unreachable = False
        self._pause = 0.0
        # The leader this beat last said it stands by for (as holder_line shows it).
        self._standing_for: str | None = None

    @property
    def info(self) -> str:
        """What beat's banner shows under the scheduler's name."""
        return f"    . elected by lock {self.lock_name!r}, wrapping {qualname(self.wrapped)}"

    @property
    def schedule(self) -> dict[str, Any]:
        """The wrapped scheduler's entries while this beat leads; none while it stands by."""
        return {} if self.leading is None else cast(dict[str, Any], self.leading.schedule)

    # -- beat's loop ---------------------------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Stand by until elected; then run one tick of the wrapped scheduler.

        Returns the seconds beat sleeps before the next tick: 0 after a wait
        for election that ran out (the wait itself was the pause).
        """
        self._ticking = True
        try:
            if self.term is None and not self._stand():
                return self._pause
            term, leading = self.term, self.leading
            assert term is not None
            assert leading is not None
            if term.lost:
                self._step_down(f"its term (token {term.token}) was lost", logging.WARNING)
                return 0.0
            return float(leading.tick(*args, **kwargs))
        finally:
            self._ticking = False

    def should_sync(self) -> bool:
        """Whether the wrapped scheduler wants its state saved now (never while standing by)."""
        return self.leading is not None and bool(self.leading.should_sync())

    def _do_sync(self) -> None:
        if self.leading is not None:
            self.leading._do_sync()

    def sync(self) -> None:
        """Save the wrapped scheduler's state (nothing to save while standing by)."""
        if self.leading is not None:
            self.leading.sync()

    def close(self) -> None:
        """Save the schedule and step down: the lock is released, a standby takes over.

        Beat calls it from its SIGTERM handler and again as its loop ends. A
        call that lands in the middle of a tick (the handler interrupted it)
        does nothing: the tick's connections are in use, and the loop's end
        calls it again.
        """
        if self._ticking:
            return
        if self.term is not None:
            self._step_down("beat is stopping", logging.INFO)
        super().close()

    # -- election -------------------------------------------------------------------

    def _election_lock(self) -> RLock:
        lock = get_lock(self.app, DEFAULT_LOCK_ALIAS, self.lock_name)
        # A term lasts as long as its leader lives: MAX_HOLD bounds work, not office.
        lock.max_hold = None
        self._lock = lock
        self._claim_script = lock.client.redis.register_script(CLAIM_SLOT)
        return lock

    def _stand(self) -> bool:
        """Wait for election (at most ``max_interval``); True once elected and loaded."""
        try:
            self._say_standing_by()
            self.term = self._office.enter_context(self._leadership)
        except LockTimeout:
            self._pause = 0.0  # waited the whole pause for it: beat may look at its shutdown flag
            return False
        except LockUnavailableError as error:
            self._pause = self._retry_after()
            if not self._unreachable:
                logger.warning(
                    "beat: cannot reach the lock server to stand for election, "
                    "trying again every %.1fs: %s",
                    self._pause,
                    error,
                )
            self._unreachable = True
            return False
        self._unreachable = False
        try:
            self.leading = self._load()
        except LockUnavailableError as error:
            self._step_down(f"the lock server could not be reached: {error}", logging.WARNING)
            self._pause = self._retry_after()
            return False
        except BaseException:
            self._step_down("the wrapped scheduler could not be loaded", logging.ERROR)
            raise
        previous, self._standing_for = self._standing_for, None
        logger.info(
            "beat: elected leader of %r (term %d)%s: sending the schedule of %s",
            self.lock_name,
            self.term.token,
            "" if previous is None else f", taking over from {previous}",
            qualname(self.wrapped),
        )
        return True

    def _say_standing_by(self) -> None:
        """Log that this beat stands by and who leads, once per leader.

        Beat shows nothing else while it waits to be elected (the wait lasts
        until the leader stops or dies), so without this line a standby looks hung.
        """
        lock = self._election_lock()
        holder = lock.holder()
        leader = None if holder is None else holder_line(holder)
        if leader is None or leader == self._standing_for:
            return  # free (this beat is about to be elected), or already said
        self._standing_for = leader
        logger.info(
            "beat: standing by: %s leads %r; this beat takes over when it stops "
            "(at once) or dies (within %.1fs)",
            leader,
            self.lock_name,
            lock.client.watchdog_timeout,
        )

    def _retry_after(self) -> float:
        timeout = self._lock.client.watchdog_timeout if self._lock is not None else 30.0
        return min(float(self.max_interval), renewal_interval(timeout))

    def _load(self) -> Scheduler:
        """A fresh wrapped scheduler, its entries caught up with the slots sent by any beat."""
        made = _claiming_class(self.wrapped)(
            self.app, *self._wrapped_args, elected=self, **self._wrapped_kwargs
        )
        entries = list(made.schedule.values())
        lock = self._current_lock()
        if entries:
            with reported_unavailable(lock.client.server, "read the beat records", lock.name):
                records = lock.client.redis.mget([self._record_key(e.name) for e in entries])
            for entry, record in zip(entries, records, strict=True):
                # The record wins over the wrapped scheduler's own last run: every
                # send is recorded, so a later local one is this beat's start time
                # (a new entry's) or the same run seen from its send time.
                if record is not None:
                    sent = _EPOCH + timedelta(milliseconds=int(record))
                    entry.last_run_at = sent.astimezone(self.app.timezone)
        return cast(Scheduler, made)

    def _step_down(self, reason: str, level: int) -> None:
        """Stop sending: close the wrapped scheduler (saving its state), leave the term."""
        leading, self.leading = self.leading, None
        term, self.term = self.term, None
        try:
            if leading is not None:
                leading.close()
        except Exception:
            logger.exception("beat: closing %s failed", qualname(self.wrapped))
        try:
            self._office.close()  # a lost term is left quietly (see Leadership)
        except LockUnavailableError as error:
            # The lock expires by itself within the watchdog timeout.
            logger.warning("beat: could not release the lock %r: %s", self.lock_name, error)
        logger.log(
            level,
            "beat: stepped down as leader of %r (term %s): %s",
            self.lock_name,
            "?" if term is None else term.token,
            reason,
        )

    # -- claims ---------------------------------------------------------------------

    def _current_lock(self) -> RLock:
        lock = self._lock
        assert lock is not None, "elected, so the election's lock was made"
        return lock

    def _current_claim_script(self) -> Script:
        script = self._claim_script
        assert script is not None, "made with the election's lock"
        return script

    def _record_key(self, entry_name: str) -> str:
        return f"{self._current_lock().keys.hash}:beat:{entry_name}"

    def claim(self, entry: ScheduleEntry) -> dict[str, object] | None:
        """Claim the due run of ``entry``: the headers to send it with, or None (don't send)."""
        term = self.term
        if term is None or term.lost:
            return None
        lock = self._current_lock()
        slot = scheduled_at(entry)
        following = entry.schedule.remaining_estimate(slot).total_seconds()
        life = max(following, 0.0) + 2 * lock.client.watchdog_timeout
        keys = [lock.keys.hash, self._record_key(entry.name)]
        args: list[str | int] = [thread_owner(), _epoch_ms(slot), milliseconds(life)]
        try:
            with reported_unavailable(lock.client.server, "claim a beat slot", lock.name):
                claimed = self._current_claim_script()(keys=keys, args=args)
        except (LockUnavailableError, RedisError) as error:
            logger.warning("beat: %s at %s not sent: cannot claim it (%s)", entry.name, slot, error)
            return None
        if claimed == 1:
            return {SLOT_HEADER: slot.astimezone(UTC).isoformat(), TOKEN_HEADER: term.token}
        if claimed == 0:
            logger.info("beat: %s at %s not sent: another beat sent it", entry.name, slot)
        else:
            logger.warning("beat: %s at %s not sent: this beat no longer leads", entry.name, slot)
        return None


#: The signals that stop beat: celery.apps.beat's handler saves the schedule and
#: raises SystemExit wherever beat's main thread is.
_STOPPING: Final = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def _stop_held() -> Iterator[None]:
    """Hold beat's stop signals from a slot's claim until its send returns; then deliver them.

    A SystemExit raised between the two left the slot claimed, so no beat sent
    it, and unsent: a standby taking over went on from the slot after it (a run
    lost at each stop that came at that moment, more often on a loaded host).
    Held here, the stop comes as soon as the message is out (or the send gave
    up: a broker that cannot be reached delays the stop by the send's retries,
    Celery's ``task_publish_retry_policy``, a few seconds). Only on the main
    thread (where Python runs signal handlers, and may change them), and only
    when the handlers in place are Python's to put back.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {stopping: signal.getsignal(stopping) for stopping in _STOPPING}
    if any(handler is None for handler in previous.values()):
        yield  # a handler installed outside Python: it could not be put back
        return
    caught: list[int] = []

    def hold(number: int, frame: FrameType | None) -> None:
        caught.append(number)

    for stopping in _STOPPING:
        signal.signal(stopping, hold)
    try:
        yield
    finally:
        for stopping, handler in previous.items():
            signal.signal(stopping, handler)
        for number in dict.fromkeys(caught):
            signal.raise_signal(number)  # its handler runs now, as it would have then


class _Claiming:
    """Mixed before the wrapped scheduler's class: each send is claimed first."""

    def __init__(self, *args: Any, elected: ElectedScheduler, **kwargs: Any) -> None:
        self.elected = elected
        super().__init__(*args, **kwargs)

    def apply_entry(self, entry: ScheduleEntry, producer: Any = None) -> None:
        """Beat's send of a due run, as Celery's own since 5.3.4.

        Celery 5.3.0-5.3.3 log the ``id`` of what ``apply_async`` returned
        unguarded (celery/celery#8428): a run not sent (its slot not claimed:
        None) would end beat's tick, and beat, with an AttributeError.
        """
        logger.info("Scheduler: Sending due task %s (%s)", entry.name, entry.task)
        try:
            result = self.apply_async(entry, producer=producer, advance=False)
        except Exception as error:
            logger.error("Message Error: %s", error, exc_info=True)
        else:
            if result is not None:
                logger.debug("%s sent. id->%s", entry.task, result.id)

    def apply_async(
        self, entry: ScheduleEntry, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        """Send ``entry``'s due run if its slot can be claimed (see the module)."""
        if advance:
            # The entry moves on, sent or not, as beat's own tick does before it sends.
            cast(Scheduler, self).reserve(entry)
        with _stop_held():  # a claimed slot is sent
            headers = self.elected.claim(entry)
            if headers is None:
                return None
            # Sent with the claim's headers; the entry keeps its own options (no copy:
            # an entry class may not be copyable, django-celery-beat's is not).
            options = entry.options
            entry.options = {**options, "headers": {**(options.get("headers") or {}), **headers}}
            try:
                return cast(Scheduler, super()).apply_async(entry, producer, False, **kwargs)
            finally:
                entry.options = options


_claiming_classes: dict[type, type] = {}


def _claiming_class(wrapped: type) -> type:
    """``wrapped`` with :class:`_Claiming` mixed in (one class per wrapped class)."""
    made = _claiming_classes.get(wrapped)
    if made is None:
        made = type(f"Elected{wrapped.__name__}", (_Claiming, wrapped), {"__module__": __name__})
        _claiming_classes[wrapped] = made
    return made


def _wrapped_class(scheduler: str | type) -> type:
    """The scheduler class ``rlock_beat_scheduler`` names, checked."""
    try:
        found = symbol_by_name(scheduler) if isinstance(scheduler, str) else scheduler
    except (ImportError, AttributeError, ValueError) as error:
        raise ConfigurationError(
            f"rlock_beat_scheduler {scheduler!r} cannot be imported: {error}"
        ) from None
    if not (isinstance(found, type) and issubclass(found, Scheduler)):
        raise ConfigurationError(
            f"rlock_beat_scheduler {scheduler!r} is not a celery.beat.Scheduler subclass"
        )
    if issubclass(found, ElectedScheduler):
        raise ConfigurationError(
            "rlock_beat_scheduler names ElectedScheduler itself: name the scheduler it "
            "should wrap (default celery.beat:PersistentScheduler)"
        )
    return found
