"""The Lua scripts: one atomic, O(1) script per lock operation.

Each script is run with EVALSHA through redis-py's ``Script``, which reloads it
when the server answers NOSCRIPT (after a restart or ``SCRIPT FLUSH``), so a
flushed script cache costs one extra round trip and nothing else.
"""

from __future__ import annotations

from typing import Any

from redis.commands.core import Script

__all__ = ["ACQUIRE", "FORCE_RELEASE", "RELEASE", "RENEW", "LockScripts"]

# KEYS[1] lock hash, KEYS[2] fencing counter
# ARGV[1] owner id, ARGV[2] expiry in milliseconds
# Returns {token, holds} when granted: a new grant INCRs the fencing counter, a
#   re-entry keeps the current token and adds one hold. A re-entry never
#   shortens the key's life (a short lease inside a watchdog hold must not
#   expire the outer hold).
# Returns the holder's PTTL in ms (an integer; -1 when the key has no expiry)
#   when another owner holds the lock.
ACQUIRE = """
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
    return {redis.call('incr', KEYS[2]), 1}
end
return redis.call('pttl', KEYS[1])
"""

# KEYS[1] lock hash, KEYS[2] release channel
# ARGV[1] owner id, ARGV[2] publish command ('publish', or 'spublish' on a cluster)
# Returns -1 when the owner holds nothing (nothing is changed), else the
#   owner's holds left; 0 means the lock is free and waiters were told.
RELEASE = """
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
    return -1
end
local holds = redis.call('hincrby', KEYS[1], ARGV[1], -1)
if holds > 0 then
    return holds
end
redis.call('del', KEYS[1])
redis.call(ARGV[2], KEYS[2], '0')
return 0
"""

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
# Returns 1 when a held lock was deleted (waiters are told), 0 when it was free.
FORCE_RELEASE = """
if redis.call('del', KEYS[1]) == 1 then
    redis.call(ARGV[1], KEYS[2], '0')
    return 1
end
return 0
"""


class LockScripts:
    """The four scripts, registered against one Redis client."""

    def __init__(self, redis: Any) -> None:
        self.acquire = Script(redis, ACQUIRE)
        self.release = Script(redis, RELEASE)
        self.renew = Script(redis, RENEW)
        self.force_release = Script(redis, FORCE_RELEASE)
