"""The fair lock's Lua scripts and their calls: grants in arrival order.

A fair lock is an RLock (same hash, fencing counter, request latch, holder
metadata, renewal) with a queue beside it, in the same hash slot::

    <prefix>:{<escaped name>}:fair           HASH     owner id -> hold count
    <prefix>:{<escaped name>}:fair:fence     STRING   last fencing token granted
    <prefix>:{<escaped name>}:fair:waiters   ZSET     queue id -> entry expiry (server ms)
    <prefix>:{<escaped name>}:fair:queue     ZSET     queue id -> arrival number
    <prefix>:{<escaped name>}:fair:released  CHANNEL  names the head to wake
    <prefix>:{<escaped name>}:fair:req:<owner>  STRING  the owner's last request id

The ``:fair`` suffix keeps a fair lock and a plain lock of the same name apart.

The rule: a grant goes to a caller only when the lock is free and the queue,
once its expired entries are dropped, is empty or has the caller at its head.
A blocking caller takes its place (the next arrival number) on its first busy
attempt and keeps it on every later one; each attempt renews its entry until
just after the sleep it is about to take. An entry whose waiter gave up
(ABANDON) goes at once; one whose waiter died or stopped retrying expires at
most the watchdog timeout + :data:`ENTRY_MARGIN_MS` after its last attempt, as
waiters never sleep longer than that (the caller caps each sleep at the watchdog
timeout, see ``core/fairlock.py``). The queue id is a waiter id of the caller's
release listener, chosen before the first attempt and then subscribed with, so
a release can name the head and wake it alone.

Handoff (granting inside the release) is not done: the woken head takes the
lock with one more acquire call, as a plain lock's waiter does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django_rlock.core.calls import ScriptCall, abandon_call
from django_rlock.core.names import LockKeys
from django_rlock.core.scripts import (
    NEXT_TOKEN_LUA,
    NOW_MS_LUA,
    REQUEST_LATCH_MS,
    LockScript,
    OomSafeScript,
)

__all__ = [
    "ENTRY_MARGIN_MS",
    "FAIR_ABANDON",
    "FAIR_ACQUIRE",
    "FAIR_RELEASE",
    "FairKeys",
    "FairScripts",
    "fair_abandon_call",
    "fair_keys",
    "with_queue",
]

#: How long a queue entry outlives the sleep its waiter announced, in ms: the
#: waiter's own delay between waking and its next attempt (as scripts.ACQUIRE).
ENTRY_MARGIN_MS = 500


class FairKeys(LockKeys):
    """A fair lock's keys: a lock's, under ``:fair``, and its arrival queue."""

    __slots__ = ()

    @property
    def queue(self) -> str:
        """The arrival queue: queue id -> arrival number."""
        return f"{self.hash}:queue"


def fair_keys(prefix: str, name: str) -> FairKeys:
    """The keys of the fair lock ``name`` under ``prefix`` (both already checked)."""
    base = LockKeys.build(prefix, name).hash + ":fair"
    return FairKeys(
        name=name,
        hash=base,
        fence=f"{base}:fence",
        waiters=f"{base}:waiters",
        channel=f"{base}:released",
    )


# Expects KEYS[3] the entries' expiries, KEYS[QUEUE] the queue, and `now`.
# Drops the expired entries, then finds `head`, the first live entry (nil: none).
# An entry missing from the expiries (never written so, but a queue must not
# stall on it) is dropped too. O(dropped * log N).
_PRUNE = """
local expired = redis.call('zrange', KEYS[3], '-inf', now, 'byscore')
for i = 1, #expired do
    redis.call('zrem', KEYS[QUEUE], expired[i])
end
if #expired > 0 then
    redis.call('zremrangebyscore', KEYS[3], '-inf', now)
end
local head = redis.call('zrange', KEYS[QUEUE], 0, 0)[1]
while head and not redis.call('zscore', KEYS[3], head) do
    redis.call('zrem', KEYS[QUEUE], head)
    head = redis.call('zrange', KEYS[QUEUE], 0, 0)[1]
end
"""


def _fill(script: str, *, queue: int) -> str:
    """``script`` with its placeholders filled in: the queue's KEYS index, the latch and margin."""
    return (
        script.replace("QUEUE", str(queue))
        .replace("LATCH_MS", str(REQUEST_LATCH_MS))
        .replace("MARGIN_MS", str(ENTRY_MARGIN_MS))
    )


# KEYS[1] lock hash, KEYS[2] fencing counter, KEYS[3] entry expiries,
# KEYS[4] the owner's request latch, KEYS[5] arrival queue
# ARGV: as scripts.ACQUIRE's, except ARGV[3], the caller's queue id ('' for an
#   attempt that will not wait: it never enters the queue), and ARGV[4], the
#   longest the caller will sleep before its next attempt, in ms.
# Returns as scripts.ACQUIRE: {token, holds, pttl} when granted (a re-entry and
#   a resent call's report work exactly as there; a re-entry ignores the queue:
#   its owner holds the lock already), else the ms to wait at most.
#   A new grant needs the lock free and the caller the queue's live head (or
#   the queue empty); it takes the caller out of the queue. Otherwise a caller
#   with a queue id is queued at the tail if it is not queued yet (its place is
#   kept on later attempts), its entry lives until its sleep ends + the margin,
#   and the wait is the holder's PTTL, or, when the lock is free but another
#   caller heads the queue, what is left of the head's entry: when it expires,
#   the next caller's retry finds itself at the head. The wait is capped by
#   ARGV[4], so the entry always outlives the sleep that follows.
FAIR_ACQUIRE = _fill(
    """
local ttl = tonumber(ARGV[2])
-- A lost grant is taken off first, as in scripts.ACQUIRE.
if tonumber(ARGV[6] or '0') ~= 0 and redis.call('get', KEYS[2]) == ARGV[7] then
    redis.call('hdel', KEYS[1], ARGV[1], '~holder', '~since')
end
if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
    if redis.call('set', KEYS[4], ARGV[5], 'px', LATCH_MS, 'get') == ARGV[5] then
        return {tonumber(redis.call('get', KEYS[2]) or '0'),
                tonumber(redis.call('hget', KEYS[1], ARGV[1])),
                redis.call('pttl', KEYS[1])}
    end
    local holds = redis.call('hincrby', KEYS[1], ARGV[1], 1)
    local left = redis.call('pttl', KEYS[1])
    if left < ttl then
        redis.call('pexpire', KEYS[1], ttl)
        redis.call('pexpire', KEYS[2], ttl)
        left = ttl
    end
    return {tonumber(redis.call('get', KEYS[2]) or '0'), holds, left}
end
"""
    + NOW_MS_LUA
    + _PRUNE
    + """
local free = redis.call('exists', KEYS[1]) == 0
if free and (not head or head == ARGV[3]) then
"""
    + NEXT_TOKEN_LUA
    + """
    if ARGV[8] and ARGV[8] ~= '' then
        local since = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
        redis.call('hset', KEYS[1], ARGV[1], 1, '~holder', ARGV[8],
                   '~since', string.format('%.0f', since))
    else
        redis.call('hset', KEYS[1], ARGV[1], 1)
    end
    redis.call('pexpire', KEYS[1], ttl)
    if head then
        redis.call('zrem', KEYS[5], ARGV[3])
        redis.call('zrem', KEYS[3], ARGV[3])
    end
    redis.call('set', KEYS[4], ARGV[5], 'px', LATCH_MS)
    redis.call('set', KEYS[2], string.format('%.0f', token), 'px', ttl)
    return {token, 1, ttl}
end
local wait
if free then
    wait = tonumber(redis.call('zscore', KEYS[3], head)) - now
else
    wait = redis.call('pttl', KEYS[1])
end
if ARGV[3] ~= '' then
    local cap = tonumber(ARGV[4])
    if wait < 0 or wait > cap then
        wait = cap
    end
    if wait < 1 then
        wait = 1
    end
    local life = wait + MARGIN_MS
    redis.call('zadd', KEYS[3], now + life, ARGV[3])
    if not redis.call('zscore', KEYS[5], ARGV[3]) then
        local last = redis.call('zrange', KEYS[5], -1, -1, 'withscores')
        redis.call('zadd', KEYS[5], (tonumber(last[2]) or 0) + 1, ARGV[3])
    end
    for _, key in ipairs({KEYS[3], KEYS[5]}) do
        if redis.call('pttl', key) < life then
            redis.call('pexpire', key, life)
        end
    end
end
return wait
""",
    queue=5,
)

# KEYS[1] lock hash, KEYS[2] release channel, KEYS[3] entry expiries,
# KEYS[4] the owner's request latch, KEYS[5] arrival queue
# ARGV[1] owner id, ARGV[2] publish command, ARGV[3] this call's request id
# Returns as scripts.RELEASE: -1 when the owner holds nothing (nothing is
#   changed), else the owner's holds left; a resent call reports as there.
#   At 0 the lock is free, and the queue's live head, if any, is named on the
#   channel: only it may take the lock, so only it is woken. A head that has
#   not subscribed yet misses nothing: it attempts again once its subscription
#   is confirmed (core/plan.py), and finds the lock free.
FAIR_RELEASE = _fill(
    """
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
    if redis.call('get', KEYS[4]) == ARGV[3] then
        return 0
    end
    return -1
end
if redis.call('set', KEYS[4], ARGV[3], 'px', LATCH_MS, 'get') == ARGV[3] then
    return tonumber(redis.call('hget', KEYS[1], ARGV[1]))
end
local holds = redis.call('hincrby', KEYS[1], ARGV[1], -1)
if holds > 0 then
    return holds
end
redis.call('del', KEYS[1])
if redis.call('exists', KEYS[5]) == 0 then
    return 0
end
"""
    + NOW_MS_LUA
    + _PRUNE
    + """
if head then
    redis.call(ARGV[2], KEYS[2], head)
end
return 0
""",
    queue=5,
)

# KEYS[1] lock hash, KEYS[2] release channel, KEYS[3] entry expiries, KEYS[4] arrival queue
# ARGV[1] queue id, ARGV[2] publish command
# A waiter leaves the queue without the lock (its wait ran out, or it was
#   cancelled). If it was queued and the lock is free, a release may have woken
#   it alone: the next live head is woken instead, so it is not left waiting
#   out its own sleep.
# Returns 1 when a head was woken, else 0.
FAIR_ABANDON = _fill(
    """
redis.call('zrem', KEYS[3], ARGV[1])
if redis.call('zrem', KEYS[4], ARGV[1]) == 0 or redis.call('exists', KEYS[1]) == 1 then
    return 0
end
"""
    + NOW_MS_LUA
    + _PRUNE
    + """
if head then
    redis.call(ARGV[2], KEYS[2], head)
    return 1
end
return 0
""",
    queue=4,
)


def with_queue(call: ScriptCall, keys: FairKeys) -> ScriptCall:
    """A plain lock's acquire or release call on ``keys``, as its fair script takes it.

    FAIR_ACQUIRE and FAIR_RELEASE take the KEYS and ARGV of scripts.ACQUIRE and
    scripts.RELEASE (built by :mod:`django_rlock.core.calls`), plus the queue
    as their last key: one builder for both kinds.
    """
    return ScriptCall(keys=[*call.keys, keys.queue], args=call.args, rid=call.rid)


def fair_abandon_call(keys: FairKeys, queue_id: str, publish: str) -> ScriptCall:
    """A waiter leaves the queue without the lock (FAIR_ABANDON)."""
    return with_queue(abandon_call(keys, queue_id, publish), keys)


class FairScripts:
    """The fair lock's scripts, registered against one Redis client (sync or asyncio).

    As :class:`~django_rlock.core.scripts.LockScripts`: acquire is plain (under
    OOM it fails whole), release and abandon run under OOM where Redis allows.
    """

    def __init__(
        self,
        redis: Any,
        plain: Callable[[Any, str], Any] = LockScript,
        oom_safe: Callable[[Any, str], Any] = OomSafeScript,
    ) -> None:
        self.acquire = plain(redis, FAIR_ACQUIRE)
        self.release = oom_safe(redis, FAIR_RELEASE)
        self.abandon = oom_safe(redis, FAIR_ABANDON)
