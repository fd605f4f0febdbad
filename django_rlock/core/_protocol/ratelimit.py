"""The rate limiter's whole protocol: its key, its Lua, its calls and replies, its rates.

A rate limiter lets ``rate`` permits through per period, shared by every
process using the same server and name, with bursts of at most ``burst``
after idling. It is GCRA (the generic cell rate algorithm, the token bucket
written as one timestamp): the limiter keeps the *theoretical arrival time*
(TAT) of its next permit on the server's clock, and one atomic script per
call decides, so clients' clocks never matter. With the interval ``T`` (the
period over ``rate``'s count, one permit per ``T``) and ``debt = max(0, TAT -
now)`` (permits taken and not refilled yet, in time), ``p`` permits are due
after ``debt + (p - burst) x T`` (at once when that is <= 0); taking them moves
the TAT to ``now + debt + p x T``. Over any window of length ``W``, the grants
are then at most ``burst + W / T`` (the TAT moves by ``T`` per permit and never
runs more than ``burst x T`` ahead of a grant), and a caller that asks as soon
as it may gets exactly ``1 / T`` per second once its burst is spent.

One HASH per name, in the name's hash slot (the library owns the hash tag, as
for locks; no other kind uses the ``:rate`` suffix)::

    <prefix>:{<escaped name>}:rate   HASH   tat (µs, server clock), interval (µs), burst,
                                            and while one is kept, the polite callers'
                                            place: place_at (µs), place (permits),
                                            place_booked ("1": counted in tat)

The key expires when the TAT is reached: then the bucket is full, which is
exactly what a missing key means, so a name costs memory only while its
permits are refilling. ``interval`` and ``burst`` are kept for operators
(``manage.py rlock inspect``) and to carry the debt across a rate change:
a caller whose interval differs rescales the debt first, so the permits
already taken stay taken (counted at the new rate), never forgiven nor
doubled. A new ``burst`` applies at once, as it is the caller's.

Waiting is a reservation, not a retry loop: ``reserve(p, within=w)`` takes the
permits when they are due within ``w`` seconds (None: whenever) and answers
how long to wait, so ``acquire()`` sleeps exactly that long and returns, and
callers queue in arrival order without waking each other. Permits reserved by
a caller that then gives up (cancelled in its sleep) stay used: the limiter
errs on the side of fewer grants.

Fairness to polite callers (``try_acquire()``, ``wait_time()``, a 429): they
book nothing, so beside ``acquire()`` callers, which book every permit as
soon as the last one is taken, a caller that waited the time it was told
found its permit reserved by someone else (0 of 25 got in). So the polite
callers together hold one *place* in the queue, as if they were one more
``acquire()`` caller: a refused ``try_acquire()`` or a ``wait_time()`` that
answers more than 0 keeps the next due time for ``p`` permits (when no place
is kept yet) and answers it, and every later reservation goes after the
place. The first polite call for at most ``p`` permits at or after that time
takes them (callers told the same time share it: one gets in, the others are
told the next place). A place is only written on a refusal and costs no
permit until a reservation has to go after it (``place_booked``); a place not
taken within :data:`PLACE_KEPT_US` (or one interval, if longer) after its
time is dropped, and its permits, if booked, stay used. Plain reservations
(``acquire()``, Celery's ``lock_rate``) neither take nor keep places.

Times are whole microseconds (the server's ``TIME``), exact in Lua's doubles
until the year 2255; the TAT is rounded up, so rounding only ever delays.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from string import Template
from typing import Any, Final, NamedTuple

from django_rlock.core._protocol.calls import ScriptCall
from django_rlock.core._protocol.lock import MakeScript, ScriptSet
from django_rlock.core._protocol.names import LockKeys, check_timeout
from django_rlock.core.exceptions import LockOutOfMemoryError

#: Seconds in each period a rate may name.
PERIODS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}

#: The most permits per second a rate may give: one per microsecond, the clock's unit.
MAX_PER_SECOND: Final = 1_000_000

#: The longest a full burst may take to refill, in seconds (about 31 years): the
#: TAT must stay an exact integer in Lua's doubles.
MAX_REFILL_SECONDS: Final = 1e9

#: How long after its time the polite callers' place is kept for them, in µs
#: (or one interval, if longer): a caller told to wait comes back late by its
#: scheduling, and a 429's Retry-After is rounded up to a whole second.
PLACE_KEPT_US: Final = 2_000_000

_RATE = re.compile(r"\A([0-9]+)/([smhd])\Z")


@dataclass(frozen=True, slots=True)
class Rate:
    """A parsed rate: ``count`` permits per ``period`` seconds (``"100/m"``: 100, 60)."""

    count: int
    period: int

    def __str__(self) -> str:
        unit = next(unit for unit, seconds in PERIODS.items() if seconds == self.period)
        return f"{self.count}/{unit}"

    @property
    def interval_us(self) -> float:
        """Microseconds between two permits at this rate (the GCRA emission interval)."""
        return self.period * 1_000_000 / self.count

    @property
    def per_second(self) -> float:
        """Permits per second."""
        return self.count / self.period


def parse_rate(rate: object) -> Rate:
    """``rate`` as a :class:`Rate`: ``"N/s"``, ``"N/m"``, ``"N/h"`` or ``"N/d"``, N >= 1.

    A :class:`Rate` is returned as it is. Anything else is a ValueError naming the rule.
    """
    if isinstance(rate, Rate):
        return rate
    if not isinstance(rate, str):
        raise ValueError(
            f"rate must be a str like '100/m' (N per s, m, h or d), not {type(rate).__name__}"
        )
    found = _RATE.match(rate)
    if found is None:
        raise ValueError(
            f"rate must be 'N/s', 'N/m', 'N/h' or 'N/d' with N a whole number >= 1, got {rate!r}"
        )
    count, period = int(found[1]), PERIODS[found[2]]
    if count < 1:
        raise ValueError(f"rate must let at least 1 permit through per period, got {rate!r}")
    if count > MAX_PER_SECOND * period:
        raise ValueError(
            f"rate must be at most {MAX_PER_SECOND}/s (one permit per microsecond), got {rate!r}"
        )
    return Rate(count, period)


def check_burst(burst: object, rate: Rate) -> int:
    """``burst``: an int >= 1, or None for the default: ``rate``'s count ("100/m": 100 at once).

    Its refill, ``burst`` intervals, may last at most :data:`MAX_REFILL_SECONDS`.
    """
    if burst is None:
        burst = rate.count
    if isinstance(burst, bool) or not isinstance(burst, int):
        raise ValueError(f"burst must be an int >= 1 or None, not {type(burst).__name__}")
    if burst < 1:
        raise ValueError(f"burst must be an int >= 1 (permits taken at once), got {burst!r}")
    if burst * rate.interval_us / 1_000_000 > MAX_REFILL_SECONDS:
        raise ValueError(
            f"burst {burst} at {rate} takes more than {MAX_REFILL_SECONDS:g} seconds to refill"
        )
    return burst


def check_take(permits: object, burst: int) -> int:
    """``permits`` one call asks for: an int from 1 to ``burst`` (more could never be granted)."""
    if isinstance(permits, bool) or not isinstance(permits, int):
        raise ValueError(f"permits must be an int >= 1, not {type(permits).__name__}")
    if permits < 1:
        raise ValueError(f"permits must be an int >= 1, got {permits!r}")
    if permits > burst:
        raise ValueError(
            f"permits must be at most the burst ({burst}): {permits} could never be granted at once"
        )
    return permits


def limiter_key(prefix: str, name: str) -> str:
    """The HASH of rate limiter ``name`` under ``prefix`` (both checked): in the name's slot."""
    return LockKeys.build(prefix, name).hash + ":rate"


def limiter_name(prefix: str, key: str) -> str | None:
    """The name of the limiter whose key is ``key`` (under ``prefix``), or None."""
    if not key.endswith(":rate"):
        return None
    return LockKeys.name_of(prefix, key.removesuffix(":rate"))


# Expects the limiter's hash $key and the caller's interval $interval (µs per
# permit, as a Lua expression). Defines `now` (the server's clock in µs), `tat`
# (the stored TAT, false when none) and `debt`: how far the TAT runs ahead of
# now, in µs at the caller's interval (0 when the bucket is full or the key is
# gone). Taken at another interval, the debt is rescaled: the permits it
# stands for stay taken.
_DEBT = Template("""
local clock = redis.call('time')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local interval = tonumber($interval)
local tat = redis.call('hget', $key, 'tat')
local debt = 0
if tat then
    debt = tonumber(tat) - now
    if debt < 0 then
        debt = 0
    else
        local was = tonumber(redis.call('hget', $key, 'interval'))
        if was and was ~= interval then
            debt = debt / was * interval
        end
    end
end
""")


def debt(*, key: str = "KEYS[1]", interval: str = "ARGV[1]") -> str:
    """Define ``now`` and ``debt`` for the limiter hash ``key`` at the interval ``interval``."""
    return _DEBT.substitute(key=key, interval=interval)


# Expects $key, `now` and `interval` (from the debt). Defines the polite callers'
# place: `place_at` (µs on the server's clock; nil when none is kept), `place`
# (its permits) and `held`: what the place adds to everyone else's debt, in µs,
# while no reservation has counted its permits in the TAT yet. A place not
# taken within max(interval, PLACE_KEPT_US) after its time is dropped here.
_PLACE = Template("""
local place_at = tonumber(redis.call('hget', $key, 'place_at'))
local place, held = 0, 0
if place_at and now > place_at + math.max(interval, $kept) then
    redis.call('hdel', $key, 'place_at', 'place', 'place_booked')
    place_at = nil
end
if place_at then
    place = tonumber(redis.call('hget', $key, 'place'))
    if redis.call('hget', $key, 'place_booked') ~= '1' then
        held = place * interval
    end
end
""")


def polite_place(*, key: str = "KEYS[1]") -> str:
    """Define ``place_at``, ``place`` and ``held`` (the polite callers' place) of ``key``."""
    return _PLACE.substitute(key=key, kept=PLACE_KEPT_US)


# Expects `debt`, `held`, `interval`, and $burst and $permits (Lua expressions).
# Defines `wait`: whole µs until the permits are due after the debt and the
# polite callers' place (0: now).
_WAIT = Template("""
local wait = math.ceil(debt + held + ($permits - $burst) * interval)
if wait < 0 then
    wait = 0
end
""")


def wait_until_due(*, burst: str = "ARGV[2]", permits: str = "ARGV[3]") -> str:
    """Define ``wait``: microseconds until ``permits`` are due with ``burst``."""
    return _WAIT.substitute(burst=f"tonumber({burst})", permits=f"tonumber({permits})")


# Expects `wait`, `place_at` and $key, $permits. A polite caller told to wait
# `wait` µs keeps that time as the polite callers' place, unless one is kept.
_KEEP_PLACE = Template("""
if wait > 0 and not place_at then
    redis.call('hset', $key, 'place_at', string.format('%.0f', now + wait),
        'place', $permits, 'place_booked', '0')
end
""")

# Expects a kept place (`place_at`, `place`, `held`), `debt`, `interval`, and
# $burst and $permits. Defines, for a polite caller asking `permits`:
# `from_bucket`, the permits it must take from the bucket (those the place
# holds and the TAT counts already are its; a caller asking more than the
# place holds takes the place and the permits after it), and `due`, whole µs
# until it may take them: the place's time, or later when the bucket's
# permits are due later (0: now).
_PLACE_DUE = Template("""
local from_bucket = $permits
if held == 0 then
    from_bucket = math.max(0, $permits - place)
end
local due = math.max(place_at - now, debt + (from_bucket - $burst) * interval)
if from_bucket == 0 then
    due = place_at - now
end
due = math.max(0, math.ceil(due))
""")

# KEYS[1] the limiter's hash
# ARGV[1] the interval in µs (one permit per interval; a decimal, maybe fractional),
# ARGV[2] burst, ARGV[3] permits (1 <= permits <= burst),
# ARGV[4] the longest the caller will wait for them, in µs (-1: as long as it takes)
# ARGV[5] 1 for a polite caller (try_acquire, a 429; ARGV[4] is then 0), else 0
# Returns {1, wait} when the permits are the caller's from `wait` µs on (0:
#   now): they are taken, the TAT moves by permits x interval (first by the
#   polite callers' place, when no reservation has counted it yet), and the
#   key lives until the TAT (when the bucket is full again). Returns {0, wait}
#   when they would be due only after the caller's longest wait: nothing is
#   taken. A polite caller takes the polite callers' place when it is due and
#   holds enough permits, is told its time when it is not due yet, and when
#   refused otherwise keeps the time it is told as the place (if none is
#   kept). O(1).
RATE_RESERVE = (
    debt()
    + polite_place()
    + """
local permits = tonumber(ARGV[3])
if ARGV[5] == '1' and place_at then
"""
    + _PLACE_DUE.substitute(burst="tonumber(ARGV[2])", permits="permits")
    + """
    if due > 0 then
        return {0, due}
    end
    if from_bucket > 0 then
        tat = math.ceil(now + debt + from_bucket * interval)
        redis.call('hset', KEYS[1], 'tat', string.format('%.0f', tat),
            'interval', ARGV[1], 'burst', ARGV[2])
        redis.call('pexpire', KEYS[1], math.ceil((tat - now) / 1000))
    end
    if permits >= place then
        redis.call('hdel', KEYS[1], 'place_at', 'place', 'place_booked')
    else
        redis.call('hset', KEYS[1], 'place', place - permits)
    end
    return {1, 0}
end
"""
    + wait_until_due()
    + """
if ARGV[5] == '1' and wait > 0 then
"""
    + _KEEP_PLACE.substitute(key="KEYS[1]", permits="ARGV[3]")
    + """
    return {0, wait}
end
local longest = tonumber(ARGV[4])
if longest >= 0 and wait > longest then
    return {0, wait}
end
tat = math.ceil(now + debt + held + permits * interval)
redis.call('hset', KEYS[1], 'tat', string.format('%.0f', tat),
    'interval', ARGV[1], 'burst', ARGV[2])
if held > 0 then
    redis.call('hset', KEYS[1], 'place_booked', '1')
end
redis.call('pexpire', KEYS[1], math.ceil((tat - now) / 1000))
return {1, wait}
"""
)


# KEYS[1] the limiter's hash
# ARGV[1] the interval in µs, ARGV[2] burst, ARGV[3] permits
# Returns the µs until a polite caller (try_acquire) would get the permits (0:
#   now). Takes nothing; when it answers more than 0 and no place is kept for
#   the polite callers, it keeps that time as their place, so a caller that
#   waits it gets in beside acquire() callers.
RATE_WAIT = (
    debt()
    + polite_place()
    + """
if place_at then
"""
    + _PLACE_DUE.substitute(burst="tonumber(ARGV[2])", permits="tonumber(ARGV[3])")
    + """
    return due
end
"""
    + wait_until_due()
    + _KEEP_PLACE.substitute(key="KEYS[1]", permits="ARGV[3]")
    + """
return wait
"""
)


# KEYS[1] the limiter's hash
# Returns nil when the bucket is full (the key is gone), else {the debt in µs
#   at the interval it was taken at, that interval, the burst, then the polite
#   callers' place: µs until its time ('' when none is kept; a place past
#   the time it is kept for counts as none, as the next reservation drops it),
#   its permits, '1' when the TAT counts them}; the interval and burst as the
#   last caller gave them. Read-only.
RATE_STATE = Template("""
local tat = redis.call('hget', KEYS[1], 'tat')
if not tat then
    return nil
end
local clock = redis.call('time')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local debt = tonumber(tat) - now
if debt < 0 then
    debt = 0
end
local interval = redis.call('hget', KEYS[1], 'interval')
local place_at = tonumber(redis.call('hget', KEYS[1], 'place_at'))
local place_in, place, booked = '', '0', '0'
if place_at and now <= place_at + math.max(tonumber(interval), $kept) then
    place_in = string.format('%.0f', place_at - now)
    place = redis.call('hget', KEYS[1], 'place') or '0'
    booked = redis.call('hget', KEYS[1], 'place_booked') or '0'
end
return {string.format('%.0f', debt), interval, redis.call('hget', KEYS[1], 'burst'),
    place_in, place, booked}
""").substitute(kept=PLACE_KEPT_US)


class RateLimiterScripts(ScriptSet):
    """The rate limiter's scripts: reserve and wait write (wait: only a place), state reads."""

    def register(self, plain: MakeScript, oom_safe: MakeScript) -> None:
        """Make the rate limiter's scripts."""
        self.reserve = plain(RATE_RESERVE)
        self.wait = plain(RATE_WAIT)
        self.state = plain(RATE_STATE)


def reserve_call(
    key: str, rate: Rate, burst: int, permits: int, longest: float | None, *, polite: bool = False
) -> ScriptCall:
    """The :data:`RATE_RESERVE` call of ``permits`` due within ``longest`` s (None: any).

    ``polite``: a try (``longest`` 0) that takes, or keeps, the polite callers' place.
    """
    longest_us = -1 if longest is None else math.floor(longest * 1_000_000)
    return ScriptCall([key], [repr(rate.interval_us), burst, permits, longest_us, int(polite)])


def wait_call(key: str, rate: Rate, burst: int, permits: int) -> ScriptCall:
    """The :data:`RATE_WAIT` call for ``permits`` (checked)."""
    return ScriptCall([key], [repr(rate.interval_us), burst, permits])


def state_call(key: str) -> ScriptCall:
    """The :data:`RATE_STATE` call of the limiter whose hash is ``key``."""
    return ScriptCall([key], [])


class Reservation(NamedTuple):
    """A reserve call's answer: ``granted`` (the permits are the caller's) and ``wait``.

    Granted: the permits are the caller's from ``wait`` seconds on (0.0: now).
    Refused: they would be due in ``wait`` seconds, past the caller's longest
    wait, and nothing was taken.
    """

    granted: bool
    wait: float


def reservation(reply: Any) -> Reservation:
    """Read a :data:`RATE_RESERVE` reply."""
    return Reservation(int(reply[0]) == 1, int(reply[1]) / 1_000_000)


@dataclass(frozen=True, slots=True)
class LimiterState:
    """What an operator sees of one rate limiter whose permits are refilling.

    ``debt`` is how far its next permit's theoretical time runs ahead of now
    (seconds), at ``interval`` seconds per permit, with ``burst``, as the last
    caller set them. ``place_in`` is the polite callers' kept place (seconds
    until its time, negative while it is kept past it; None when none is
    kept), for ``place`` permits; ``place_booked`` when the TAT counts them
    already (else they add to every other caller's wait: :attr:`held`).
    """

    name: str
    debt: float
    interval: float
    burst: int
    place_in: float | None = None
    place: int = 0
    place_booked: bool = False

    @property
    def held(self) -> float:
        """Seconds the kept place adds to a reservation's wait (its permits, not yet booked)."""
        if self.place_in is None or self.place_booked:
            return 0.0
        return self.place * self.interval

    @property
    def rate(self) -> str:
        """The rate, as ``"N/unit"`` when a whole number of permits fits a period."""
        for unit, seconds in PERIODS.items():
            count = seconds / self.interval
            if abs(count - round(count)) < 1e-6 * count and round(count) >= 1:
                return f"{round(count)}/{unit}"
        return f"{1 / self.interval:.6g}/s"

    @property
    def available(self) -> int:
        """Permits that may be taken now (after the polite callers' kept place)."""
        owed = self.debt + self.held
        return max(0, math.floor(self.burst - owed / self.interval + 1e-9))

    @property
    def next_in(self) -> float:
        """Seconds until one more permit is due (0.0: one is available now)."""
        return max(0.0, self.debt + self.held + (1 - self.burst) * self.interval)

    @property
    def full_in(self) -> float:
        """Seconds until the whole burst is available again (when the key expires)."""
        return self.debt


def limiter_state(name: str, reply: Any) -> LimiterState | None:
    """Read a :data:`RATE_STATE` reply for limiter ``name`` (None: its bucket is full)."""
    if reply is None:
        return None
    debt_us, interval_us, burst, *kept = (
        value.decode() if isinstance(value, bytes) else str(value) for value in reply
    )
    place_in, place, booked = kept or ("", "0", "0")
    return LimiterState(
        name=name,
        debt=int(debt_us) / 1_000_000,
        interval=float(interval_us) / 1_000_000,
        burst=int(burst),
        place_in=int(place_in) / 1_000_000 if place_in else None,
        place=int(place) if place_in else 0,
        place_booked=place_in != "" and booked == "1",
    )


class RateLimiterBase:
    """What the threaded ``RateLimiter`` and the asyncio ``AsyncRateLimiter`` share.

    The checked rate and burst, the key, and every call's KEYS and ARGV; the
    shells send them (sync or awaited) and sleep for a reservation's wait.
    """

    def __init__(self, key_prefix: str, name: str, rate: object, burst: object = None) -> None:
        self.name = name
        #: The rate (``str(limiter.rate)`` is ``"100/m"``).
        self.rate = parse_rate(rate)
        #: Permits that may be taken at once after idling.
        self.burst = check_burst(burst, self.rate)
        self.key = limiter_key(key_prefix, name)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} {self.rate} burst={self.burst}>"

    def _reserve_call(self, permits: object, within: object, polite: bool = False) -> ScriptCall:
        """The :data:`RATE_RESERVE` call of ``permits`` due within ``within`` s (None: ever).

        ``polite`` (a try: ``within`` must be 0) takes or keeps the polite callers' place.
        """
        taken = check_take(permits, self.burst)
        longest = check_timeout(within)
        if polite and longest != 0:
            raise ValueError(f"a polite reserve never waits: within must be 0, got {within!r}")
        return reserve_call(self.key, self.rate, self.burst, taken, longest, polite=polite)

    def _wait_call(self, permits: object) -> ScriptCall:
        """The :data:`RATE_WAIT` call for ``permits``."""
        return wait_call(self.key, self.rate, self.burst, check_take(permits, self.burst))

    def _action(self) -> str:
        """How an unreachable server's error names what was asked."""
        return f"use rate limiter {self.name!r}"

    def _out_of_memory_error(self, error: Exception) -> LockOutOfMemoryError:
        return LockOutOfMemoryError(
            f"cannot take permits of rate limiter {self.name!r}: Redis is out of memory "
            f"(maxmemory reached and nothing may be evicted): {error}",
            name=self.name,
        )
