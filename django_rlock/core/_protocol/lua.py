"""The Lua pieces the lock kinds' scripts are made of (no I/O).

The plain lock (:mod:`~django_rlock.core._protocol.lock`), the fair lock, the
read-write lock and the semaphore share their rules: one clock, one fencing
rule, one request latch, one way a grant is written, a waiter registers and a
release wakes. Each rule is written once, here, as a snippet or as a function
returning the snippet for the keys a script passes; each kind's module composes
its scripts from these and from what is really its own.

The comment at each snippet is its contract: the KEYS, ARGV and locals it
expects, and the locals it defines or what it returns. A function fills its
snippet's placeholders (``KEYS[LATCH]``, ``LATCH_MS``, ...) itself, so no
placeholder of this module is left for a script to fill.
"""

from __future__ import annotations

#: How long a request latch outlives its call, in milliseconds. It must cover
#: redis-py's whole retry window (10 retries with up to 1 s of backoff each by
#: default, plus reconnects); a latch costs ~100 bytes for that long.
REQUEST_LATCH_MS = 60_000


#: How long a waiter's registration outlives the sleep it announced, in ms: the
#: waiter's own delay between waking and its next attempt.
WAITER_MARGIN_MS = 500


# Defines `clock` (the TIME reply) and `now`: the server's time in ms (scripts
# are replicated by effects, so TIME is allowed).
NOW_MS_LUA = """
local clock = redis.call('time')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""


# Expects KEYS[2] the fencing counter. Defines `clock` (the TIME reply) and
# `token`: the next fencing token, max(last + 1, the server's time in
# microseconds). It fits a Lua number (a double, exact below 2^53, which the
# clock reaches in the year 2255), a signed 64-bit integer and a Postgres
# bigint; whoever stores it writes it with '%.0f', as Lua would write a number
# this large as '1.7e+15'.
NEXT_TOKEN_LUA = """
local clock = redis.call('time')
local token = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local last = tonumber(redis.call('get', KEYS[2]) or '0') or 0
if token <= last then
    token = last + 1
end
"""


#: The token of the current grant, as a Lua expression: the fencing counter
#: KEYS[2] (0 when it is gone).
CURRENT_TOKEN = "tonumber(redis.call('get', KEYS[2]) or '0')"


# Expects KEYS[1] the lock hash, KEYS[2] its fencing counter, ARGV[1] owner id,
# ARGV[6] the owner's holds its client declared lost (0: none), ARGV[7] their token.
# Takes the lost grant off first, before the latch is read, so a lost grant is
# never reported again, even to a retry of a call that re-entered it. While
# the fence is still the lost grant's token, every hold the owner has is of
# that grant (a re-entry keeps the token), including re-entries whose replies
# were lost (so the server may count more than the client declared): all of
# them go. The lock is exclusive, so its description (and FIELDS) was this
# owner's too; an emptied hash is deleted.
_DROP_LOST_GRANT = """
if tonumber(ARGV[6] or '0') ~= 0 and redis.call('get', KEYS[2]) == ARGV[7] then
    redis.call('hdel', KEYS[1], ARGV[1], '~holder', '~since'FIELDS)
end
"""


def drop_lost_grant(*fields: str) -> str:
    """The lost-grant removal; ``fields``: the kind's own hash fields that go with it."""
    return _DROP_LOST_GRANT.replace("FIELDS", "".join(f", '{field}'" for field in fields))


# Expects LOST_HOLDS the number of the owner's holds its client declared lost
# (0 or absent: none), OWN_KEY the owner's own hold key (a read hold, a
# semaphore's permits), OWNERS the set naming the owners that have such a
# key, ARGV[1] owner id.
# The key is the owner's alone, so all of it goes, before the latch is read:
# the call is a new grant, never a report of holds its owner was told are gone.
_DROP_LOST_KEY = """
if tonumber(LOST_HOLDS or '0') ~= 0 then
    redis.call('del', OWN_KEY)
    redis.call('srem', OWNERS, ARGV[1])
end
"""


def drop_lost_key(*, key: str, index: str, lost: str = "ARGV[6]") -> str:
    """The removal of the owner's own hold ``key`` (and its place in ``index``) declared lost."""
    return (
        _DROP_LOST_KEY.replace("LOST_HOLDS", lost).replace("OWN_KEY", key).replace("OWNERS", index)
    )


# Expects KEYS[1] the lock hash, KEYS[LATCH] the owner's request latch
# (optional), ARGV[1] owner id, ARGV[5] (with the latch) request id, `ttl` the
# expiry in ms. When the owner holds the lock, returns {TOKEN, holds, pttl}:
# a resent call already granted (its latch holds its request id) changes
# nothing and reports the holds and PTTL now; else, after the kind's own
# HANDOFF step (which may return), one more hold, and the key's life is
# never shortened (a short lease inside a watchdog hold must not expire the
# outer hold); when it is lengthened, so is the fencing counter's FENCE (nil:
# none), as both expire together. Otherwise does nothing.
_REPORT_OR_REENTER = """
if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
    if KEYS[LATCH]
            and redis.call('set', KEYS[LATCH], ARGV[5], 'px', LATCH_MS, 'get') == ARGV[5] then
        return {TOKEN, tonumber(redis.call('hget', KEYS[1], ARGV[1])), redis.call('pttl', KEYS[1])}
    end
HANDOFF
    local holds = redis.call('hincrby', KEYS[1], ARGV[1], 1)
    local left = redis.call('pttl', KEYS[1])
    if left < ttl then
        redis.call('pexpire', KEYS[1], ttl)
PEXPIRE_FENCE
        left = ttl
    end
    return {TOKEN, holds, left}
end
"""


def report_or_reenter(*, latch: str, token: str, fence: str | None, handoff: str = "") -> str:
    """The resend report and the re-entry for KEYS[``latch``] and the Lua ``token`` expression.

    ``fence``: the counter key renewed with the hash (None: the kind has none);
    ``handoff``: a step of the kind's own between the report and the re-entry.
    """
    renew_fence = f"        redis.call('pexpire', {fence}, ttl)" if fence else ""
    return (
        _REPORT_OR_REENTER.replace("HANDOFF\n", handoff)
        .replace("PEXPIRE_FENCE\n", renew_fence + "\n" if renew_fence else "")
        .replace("TOKEN", token)
        .replace("KEYS[LATCH]", f"KEYS[{latch}]")
        .replace("LATCH_MS", str(REQUEST_LATCH_MS))
    )


# Expects the lock free (inside the script's grant branch), KEYS[1] the lock
# hash, KEYS[2] its fencing counter, KEYS[LATCH] the owner's request latch
# (optional), ARGV[1] owner id, ARGV[5] (with the latch) request id, ARGV[8]
# who asks ('' or absent: nobody said), `ttl` the expiry in ms.
# A new grant: the next token (NEXT_TOKEN_LUA), one hold, the description
# stored as '~holder' with the server's time in ms as '~since' (owner ids
# never start with '~', and the fields expire and go with the lock), the
# caller leaves the waiting set by the kind's own LEAVE step, the latch is
# set, the counter expires with the lock. Returns {token, 1, ttl}.
_NEW_GRANT = (
    NEXT_TOKEN_LUA
    + """
if ARGV[8] and ARGV[8] ~= '' then
    local since = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
    redis.call('hset', KEYS[1], ARGV[1], 1, '~holder', ARGV[8],
               '~since', string.format('%.0f', since))
else
    redis.call('hset', KEYS[1], ARGV[1], 1)
end
redis.call('pexpire', KEYS[1], ttl)
LEAVE
if KEYS[LATCH] then
    redis.call('set', KEYS[LATCH], ARGV[5], 'px', LATCH_MS)
end
redis.call('set', KEYS[2], string.format('%.0f', token), 'px', ttl)
return {token, 1, ttl}
"""
)


#: The usual LEAVE step of :func:`new_grant`: a granted waiter (ARGV[3], ''
#: for none) leaves the waiting set KEYS[3].
LEAVE_WAITING_SET = """
if ARGV[3] ~= '' then
    redis.call('zrem', KEYS[3], ARGV[3])
end
"""


def new_grant(*, latch: str, leave: str = LEAVE_WAITING_SET) -> str:
    """A new grant with the request latch KEYS[``latch``]; ``leave`` takes the caller out."""
    return (
        _NEW_GRANT.replace("LEAVE\n", leave.lstrip("\n"))
        .replace("KEYS[LATCH]", f"KEYS[{latch}]")
        .replace("LATCH_MS", str(REQUEST_LATCH_MS))
    )


# Expects `WAIT`: the ms the caller waits at most (the holder's PTTL; -1: no
# expiry), ARGV[3] waiter id ('' for an attempt that will not wait), ARGV[4]
# the longest the waiter will sleep, in ms. A waiter is (re-)entered in the
# waiting set WAITERS until just after its sleep ends (the sleep, cut to WAIT,
# plus the margin that covers its own delay in re-registering), so a release
# can wake it; the set lives at least as long. Ends the script: returns WAIT.
_REGISTER_WAITER = (
    """
if ARGV[3] ~= '' then
"""
    + NOW_MS_LUA
    + """
    local sleep = tonumber(ARGV[4])
    if WAIT >= 0 and WAIT < sleep then
        sleep = WAIT
    end
    local life = sleep + MARGIN_MS
    redis.call('zadd', WAITERS, now + life, ARGV[3])
    if redis.call('pttl', WAITERS) < life then
        redis.call('pexpire', WAITERS, life)
    end
end
return WAIT
"""
)


def register_waiter(*, waiters: str = "KEYS[3]", wait: str = "pttl") -> str:
    """Register the waiter in the set ``waiters`` for the local ``wait``, and return it."""
    return (
        _REGISTER_WAITER.replace("WAITERS", waiters)
        .replace("WAIT", wait)
        .replace("MARGIN_MS", str(WAITER_MARGIN_MS))
    )


# Expects HOLD the owner's hold hash, KEYS[LATCH] its request latch
# (optional), ARGV[1] owner id, ARGV[3] (with the latch) request id.
# Returns -1 when the owner holds nothing (nothing is changed). A resent call
# that was already applied changes nothing and returns the owner's holds now
# (0 after a final release, even if another owner holds since). Otherwise
# takes one hold off and defines `holds`, the owner's holds left.
_RELEASE_HOLD = """
if redis.call('hexists', HOLD, ARGV[1]) == 0 then
    if KEYS[LATCH] and redis.call('get', KEYS[LATCH]) == ARGV[3] then
        return 0
    end
    return -1
end
if KEYS[LATCH] and redis.call('set', KEYS[LATCH], ARGV[3], 'px', LATCH_MS, 'get') == ARGV[3] then
    return tonumber(redis.call('hget', HOLD, ARGV[1]))
end
local holds = redis.call('hincrby', HOLD, ARGV[1], -1)
"""


def release_hold(*, hold: str = "KEYS[1]", latch: str) -> str:
    """Take one of the owner's holds off ``hold``, idempotently with the latch KEYS[``latch``]."""
    return (
        _RELEASE_HOLD.replace("HOLD", hold)
        .replace("KEYS[LATCH]", f"KEYS[{latch}]")
        .replace("LATCH_MS", str(REQUEST_LATCH_MS))
    )


def release_one(*, latch: str) -> str:
    """:func:`release_hold` on KEYS[1], returning the holds left; at 0, KEYS[1] is deleted.

    What follows is the kind's full-release step (who to wake).
    """
    return (
        release_hold(latch=latch)
        + """if holds > 0 then
    return holds
end
redis.call('del', KEYS[1])
"""
    )


# Expects WAITERS the waiting set, CHANNEL the release channel, ARGV[2] the
# publish command. After a release that freed the lock: with no registered
# waiter left (expired registrations are dropped), nothing is published (a
# PUBLISH costs the server a channel lookup on every uncontended release);
# else the release is published, naming the waiter whose sleep ends first or,
# for EVERYONE, with an empty message that wakes every waiter. Ends the
# script: returns 0.
_WAKE_AFTER_RELEASE = (
    """
if redis.call('exists', WAITERS) == 0 then
    return 0
end
"""
    + NOW_MS_LUA
    + """
redis.call('zremrangebyscore', WAITERS, '-inf', now)
PUBLISH
return 0
"""
)


_PUBLISH_FIRST = """local first = redis.call('zrange', WAITERS, 0, 0)
if first[1] then
    redis.call(ARGV[2], CHANNEL, first[1])
end
"""


_PUBLISH_EVERYONE = """if redis.call('zcard', WAITERS) > 0 then
    redis.call(ARGV[2], CHANNEL, '')
end
"""


def wake_after_release(*, waiters: str, channel: str, everyone: bool = False) -> str:
    """Wake the first registered waiter in ``waiters`` on ``channel`` (or ``everyone``)."""
    publish = _PUBLISH_EVERYONE if everyone else _PUBLISH_FIRST
    return (
        _WAKE_AFTER_RELEASE.replace("PUBLISH\n", publish)
        .replace("WAITERS", waiters)
        .replace("CHANNEL", channel)
    )
