"""The Lua scripts: one atomic, O(1) script per lock operation.

Each script is run with EVALSHA through redis-py's ``Script``, which reloads it
when the server answers NOSCRIPT (after a restart or ``SCRIPT FLUSH``), so a
flushed script cache costs one extra round trip and nothing else.
"""

from __future__ import annotations

from typing import Any

from redis.commands.core import Script

__all__ = ["ABANDON", "ACQUIRE", "FORCE_RELEASE", "RELEASE", "RENEW", "LockScripts"]

# Server time in milliseconds (scripts are replicated by effects, so TIME is allowed).
_NOW_MS = """
local clock = redis.call('time')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""

# KEYS[1] lock hash, KEYS[2] fencing counter, KEYS[3] waiting set
# ARGV[1] owner id, ARGV[2] expiry in milliseconds,
# ARGV[3] waiter id ('' for an attempt that will not wait),
# ARGV[4] the longest the waiter will sleep before trying again, in milliseconds
# Returns {token, holds} when granted: a new grant INCRs the fencing counter, a
#   re-entry keeps the current token and adds one hold. A re-entry never
#   shortens the key's life (a short lease inside a watchdog hold must not
#   expire the outer hold). A granted waiter leaves the waiting set.
# Returns the holder's PTTL in ms (an integer; -1 when the key has no expiry)
#   when another owner holds the lock; a waiter is then (re-)entered in the
#   waiting set until just after its sleep ends, so a release can wake it.
ACQUIRE = (
    """
local ttl = tonumber(ARGV[2])
if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
    local holds = redis.call('hincrby', KEYS[1], ARGV[1], 1)
    if redis.call('pttl', KEYS[1]) < ttl then
        redis.call('pexpire', KEYS[1], ttl)
    end
    return {tonumber(redis.call('get', KEYS[2]) or '0'), holds}
end
if redis.call('exists', KEYS[1]) == 0 then
    redis.call('hset', KEYS[1], ARGV[1], 1)
    redis.call('pexpire', KEYS[1], ttl)
    if ARGV[3] ~= '' then
        redis.call('zrem', KEYS[3], ARGV[3])
    end
    return {redis.call('incr', KEYS[2]), 1}
end
local pttl = redis.call('pttl', KEYS[1])
if ARGV[3] ~= '' then
"""
    + _NOW_MS
    + """
    local sleep = tonumber(ARGV[4])
    if pttl >= 0 and pttl < sleep then
        sleep = pttl
    end
    -- The margin covers the waiter's own delay in re-registering after its sleep.
    local life = sleep + 500
    redis.call('zadd', KEYS[3], now + life, ARGV[3])
    if redis.call('pttl', KEYS[3]) < life then
        redis.call('pexpire', KEYS[3], life)
    end
end
return pttl
"""
)

# KEYS[1] lock hash, KEYS[2] release channel, KEYS[3] waiting set
# ARGV[1] owner id, ARGV[2] publish command ('publish', or 'spublish' on a cluster)
# Returns -1 when the owner holds nothing (nothing is changed), else the
#   owner's holds left. At 0 the lock is free, and the release is published
#   naming the waiter to wake: the registered waiter whose sleep ends first
#   (expired registrations are dropped), or '' (everyone) when none is left.
RELEASE = (
    """
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
    return -1
end
local holds = redis.call('hincrby', KEYS[1], ARGV[1], -1)
if holds > 0 then
    return holds
end
redis.call('del', KEYS[1])
local target = ''
if redis.call('exists', KEYS[3]) == 1 then
"""
    + _NOW_MS
    + """
    redis.call('zremrangebyscore', KEYS[3], '-inf', now)
    local first = redis.call('zrange', KEYS[3], 0, 0)
    if first[1] then
        target = first[1]
    end
end
redis.call(ARGV[2], KEYS[2], target)
return 0
"""
)

# KEYS[1..n] lock hashes
# ARGV[1] expiry in milliseconds, ARGV[1+i] owner id of KEYS[i]
# Returns n integers: 1 renewed, 0 the owner no longer holds KEYS[i] (lost).
RENEW = """
local ttl = ARGV[1]
local renewed = {}
for i, key in ipairs(KEYS) do
    if redis.call('hexists', key, ARGV[i + 1]) == 1 then
        redis.call('pexpire', key, ttl)
        renewed[i] = 1
    else
        renewed[i] = 0
    end
end
return renewed
"""

# KEYS[1] lock hash, KEYS[2] release channel
# ARGV[1] publish command
# Returns 1 when a held lock was deleted (every waiter is woken), 0 when it was free.
FORCE_RELEASE = """
if redis.call('del', KEYS[1]) == 1 then
    redis.call(ARGV[1], KEYS[2], '')
    return 1
end
return 0
"""

# KEYS[1] lock hash, KEYS[2] release channel, KEYS[3] waiting set
# ARGV[1] waiter id, ARGV[2] publish command
# A waiter leaves without the lock (its wait ran out). If the lock is free, a
#   release may have woken this waiter alone: wake the others instead.
# Returns 1 when the others were woken, else 0.
ABANDON = """
redis.call('zrem', KEYS[3], ARGV[1])
if redis.call('exists', KEYS[1]) == 0 and redis.call('zcard', KEYS[3]) > 0 then
    redis.call(ARGV[2], KEYS[2], '')
    return 1
end
return 0
"""


class LockScripts:
    """The lock scripts, registered against one Redis client."""

    def __init__(self, redis: Any) -> None:
        self.acquire = Script(redis, ACQUIRE)
        self.release = Script(redis, RELEASE)
        self.renew = Script(redis, RENEW)
        self.force_release = Script(redis, FORCE_RELEASE)
        self.abandon = Script(redis, ABANDON)
